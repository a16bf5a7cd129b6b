//! Who may call: per-node [`Token`]s checked in constant time, and the rule that a node acts
//! only for itself.
//!
//! Every call carries the acting node's id and token as metadata ([`NODE_HEADER`],
//! [`TOKEN_HEADER`]). A relay passes both through unchanged, so the serving agent checks the
//! original caller itself rather than trusting the relay. A missing, unknown or wrong
//! credential gets `UNAUTHENTICATED`, with the same answer for each so a caller cannot probe
//! which node ids exist.
//!
//! What an authenticated caller may do depends on its [`Scope`]:
//! - [`Scope::Node`]: calls that act for a node (attach, detach, node expand) only for its own
//!   node id, and with its own plugin node id; read-only calls (validate, list). It cannot
//!   create, delete, expand on the controller or snapshot: a misbehaving node's blast radius
//!   is itself.
//! - [`Scope::Cluster`]: everything (the component that decides for the cluster).

use std::collections::HashMap;
use std::fmt;

use csi_structs::NodeId;

/// Metadata key holding the acting node's orchestrator id (binary metadata: node ids may be
/// any UTF-8).
pub const NODE_HEADER: &str = "x-csisdk-node-bin";
/// Metadata key holding the acting node's token.
pub const TOKEN_HEADER: &str = "x-csisdk-token";
/// Metadata key holding how many agents the call already passed through.
pub const HOPS_HEADER: &str = "x-csisdk-hops";

/// The shortest token accepted, in bytes.
pub const MIN_TOKEN_BYTES: usize = 16;
/// The longest token accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 256;

/// A node's secret token. `Debug` prints nothing of it and there is no `Display`; compare with
/// [`Token::matches`], which takes the same time wherever the first difference is.
///
/// ```
/// use csi_rpc_shim::Token;
///
/// let t = Token::new("0123456789abcdef-secret")?;
/// assert_eq!(format!("{t:?}"), "Token(<redacted>)");
/// assert!(t.matches("0123456789abcdef-secret"));
/// assert!(!t.matches("0123456789abcdef-secreT"));
/// # Ok::<(), csi_rpc_shim::TokenError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

/// Why a string cannot be a [`Token`]. Never holds the token itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Shorter than [`MIN_TOKEN_BYTES`].
    #[error("token is {len} bytes, shorter than the minimum of {min}")]
    TooShort {
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// Longer than [`MAX_TOKEN_BYTES`].
    #[error("token is {len} bytes, longer than the maximum of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Holds a byte that cannot travel in gRPC metadata (only visible ASCII can).
    #[error("token has a byte outside visible ASCII at position {position}")]
    BadByte {
        /// Where.
        position: usize,
    },
}

impl Token {
    /// Checks and wraps a token.
    ///
    /// # Errors
    ///
    /// [`TokenError`] when it is shorter than [`MIN_TOKEN_BYTES`], longer than
    /// [`MAX_TOKEN_BYTES`], or has a byte outside visible ASCII.
    pub fn new(value: impl Into<String>) -> Result<Self, TokenError> {
        let value = value.into();
        let len = value.len();
        if len < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort {
                len,
                min: MIN_TOKEN_BYTES,
            });
        }
        if len > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong {
                len,
                max: MAX_TOKEN_BYTES,
            });
        }
        if let Some(position) = value.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(TokenError::BadByte { position });
        }
        Ok(Self(value))
    }

    /// Whether `presented` equals this token, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }

    /// The token, for putting in metadata. Do not log it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Compares two byte strings in time that depends only on their lengths, never on where they
/// differ. Tokens have a public length range, so leaking the length leaks nothing useful.
///
/// Hand-written (a dozen lines) rather than pulling in a crate: XOR every byte pair, OR the
/// results together, and only look at the accumulator at the end. `black_box` keeps the
/// optimiser from turning the loop into an early exit.
///
/// Public so that every secret comparison in a program built on this crate (an agent's control
/// API token, say) uses this one function.
///
/// ```
/// use csi_rpc_shim::auth::constant_time_eq;
/// assert!(constant_time_eq(b"token-a", b"token-a"));
/// assert!(!constant_time_eq(b"token-a", b"token-b"));
/// assert!(!constant_time_eq(b"token", b"token-a"));
/// ```
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// What an authenticated caller may do (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Act only for its own node id; read-only calls otherwise.
    Node,
    /// Act for any node, create and delete volumes and snapshots.
    Cluster,
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Its node id.
    pub node: NodeId,
    /// What it may do.
    pub scope: Scope,
}

/// The credentials this agent presents on its own calls.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// This agent's node id.
    pub node: NodeId,
    /// Its token.
    pub token: Token,
}

/// The tokens and scopes of the nodes allowed to call this agent.
#[derive(Clone, Debug, Default)]
pub struct TokenBook {
    entries: HashMap<NodeId, (Token, Scope)>,
}

impl TokenBook {
    /// An empty book: every call is refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `node` to call with `token`, within `scope`. Replaces an earlier entry.
    pub fn insert(&mut self, node: NodeId, token: Token, scope: Scope) {
        self.entries.insert(node, (token, scope));
    }

    /// The same book with one more entry.
    #[must_use]
    pub fn with(mut self, node: NodeId, token: Token, scope: Scope) -> Self {
        self.insert(node, token, scope);
        self
    }

    /// Removes `node`'s entry (a node that left the cluster).
    pub fn remove(&mut self, node: &NodeId) {
        self.entries.remove(node);
    }

    /// The principal for a presented node id and token, or `None` when the node is unknown or
    /// the token is wrong (deliberately the same answer).
    pub fn authenticate(&self, node: &str, token: &str) -> Option<Principal> {
        let id = NodeId::new(node).ok()?;
        let (id, (expected, scope)) = self.entries.get_key_value(&id)?;
        expected.matches(token).then(|| Principal {
            node: id.clone(),
            scope: *scope,
        })
    }

    /// The scope of `node`, if it has an entry.
    pub fn scope_of(&self, node: &NodeId) -> Option<Scope> {
        self.entries.get(node).map(|(_, s)| *s)
    }
}

/// Why an authenticated caller may not make a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A node-scoped caller tried to act for another node.
    #[error("node {caller} may act only for itself, not for node {subject}")]
    OtherNode {
        /// Who called.
        caller: NodeId,
        /// Whom it tried to act for.
        subject: NodeId,
    },
    /// A node-scoped caller named a plugin node id that is not its own for this plugin (or
    /// whose own plugin node id is not known).
    #[error("node {caller} named a plugin node id that is not its own")]
    OtherPluginNode {
        /// Who called.
        caller: NodeId,
    },
    /// A node-scoped caller tried a cluster-wide call.
    #[error("node {caller} is node-scoped and may not make cluster-wide calls")]
    ClusterOnly {
        /// Who called.
        caller: NodeId,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_plain_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn token_rules() {
        assert!(matches!(
            Token::new("short"),
            Err(TokenError::TooShort { len: 5, .. })
        ));
        assert!(matches!(
            Token::new("x".repeat(300)),
            Err(TokenError::TooLong { len: 300, .. })
        ));
        assert_eq!(
            Token::new("0123456789abcdef ghi"),
            Err(TokenError::BadByte { position: 16 })
        );
        let t = Token::new("0123456789abcdef").unwrap();
        assert!(!format!("{t:?}").contains("0123"));
        let creds = Credentials {
            node: NodeId::new("a").unwrap(),
            token: t,
        };
        assert!(!format!("{creds:?}").contains("0123"));
    }

    #[test]
    fn book_authenticates_known_nodes_only() {
        let a = NodeId::new("a").unwrap();
        let book = TokenBook::new().with(
            a.clone(),
            Token::new("token-of-node-a-0001").unwrap(),
            Scope::Node,
        );
        assert_eq!(
            book.authenticate("a", "token-of-node-a-0001"),
            Some(Principal {
                node: a,
                scope: Scope::Node
            })
        );
        assert_eq!(book.authenticate("a", "token-of-node-a-0002"), None);
        assert_eq!(book.authenticate("b", "token-of-node-a-0001"), None);
        assert_eq!(book.authenticate("", "token-of-node-a-0001"), None);
    }
}
