//! A volume's secrets read from a file an operator wrote, refused when other users could read
//! it.
//!
//! The file holds `KEY=VALUE` lines (with `[section]` lines for the secrets of one kind of
//! call) or the same as a JSON object; see
//! [`VolumeSecrets`](csi_structs::volume_secrets) for both forms. Errors name the file, the
//! line and the key, never a value.
//!
//! ```no_run
//! use csi_node::secrets::read_secrets_file;
//! use csi_structs::SecretsUse;
//!
//! # fn run() -> Result<(), csi_node::secrets::SecretsFileError> {
//! let secrets = read_secrets_file("/etc/my-orchestrator/db.secrets".as_ref())?;
//! let for_stage = secrets.for_use(SecretsUse::NodeStage);
//! println!("NodeStageVolume gets {} secret(s)", for_stage.len());
//! # Ok(()) }
//! ```

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use csi_structs::volume_secrets::{SecretsTextError, VolumeSecrets};

/// The largest secrets file read (bytes): well above what the spec lets one call carry
/// (4 KiB per map, one map per kind of call).
pub const MAX_SECRETS_FILE_BYTES: u64 = 64 << 10;

/// Why a secrets file was refused. Never holds a secret value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsFileError {
    /// The file cannot be opened or read.
    #[error("secrets file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Other users may read or write the file.
    #[error(
        "secrets file {path} has mode {mode:04o}: other users may read or write it; \
         `chmod 600` it first"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a regular file.
    #[error("secrets file {path} is not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// Larger than [`MAX_SECRETS_FILE_BYTES`].
    #[error("secrets file {path} is {size} bytes; the limit is {limit} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Not UTF-8 text.
    #[error("secrets file {path} is not UTF-8 text")]
    NotText {
        /// The file.
        path: PathBuf,
    },
    /// The `KEY=VALUE` form is broken.
    #[error("secrets file {path}: {source}")]
    Text {
        /// The file.
        path: PathBuf,
        /// What is wrong, by line.
        #[source]
        source: SecretsTextError,
    },
    /// The JSON form is broken.
    #[error("secrets file {path} is not valid JSON secrets: {detail}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's explanation (position and rule; it never quotes a value).
        detail: String,
    },
}

/// Reads the secrets in `path`: the JSON form when the text starts with `{`, the
/// `KEY=VALUE` form otherwise.
///
/// # Errors
///
/// [`SecretsFileError`]: the file is readable or writable by other users (mode `o+r` or
/// `o+w`), is not a regular file, is larger than [`MAX_SECRETS_FILE_BYTES`], is not UTF-8,
/// holds no secret, or breaks a rule of either form (naming the line and the key).
pub fn read_secrets_file(path: &Path) -> Result<VolumeSecrets, SecretsFileError> {
    let io = |source| SecretsFileError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // The opened file's metadata, so what is checked is what is read.
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SecretsFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o006 != 0 {
        return Err(SecretsFileError::Exposed {
            path: path.to_owned(),
            mode,
        });
    }
    if meta.len() > MAX_SECRETS_FILE_BYTES {
        return Err(SecretsFileError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
            limit: MAX_SECRETS_FILE_BYTES,
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_SECRETS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > MAX_SECRETS_FILE_BYTES {
        return Err(SecretsFileError::TooLarge {
            path: path.to_owned(),
            size,
            limit: MAX_SECRETS_FILE_BYTES,
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| SecretsFileError::NotText {
        path: path.to_owned(),
    })?;
    parse_secrets(&text).map_err(|e| match e {
        Parse::Text(source) => SecretsFileError::Text {
            path: path.to_owned(),
            source,
        },
        Parse::Json(detail) => SecretsFileError::Json {
            path: path.to_owned(),
            detail,
        },
    })
}

enum Parse {
    Text(SecretsTextError),
    Json(String),
}

fn parse_secrets(text: &str) -> Result<VolumeSecrets, Parse> {
    let body = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if !body.starts_with('{') {
        return VolumeSecrets::parse_key_values(text).map_err(Parse::Text);
    }
    // csi-structs' deserializer never puts a value in its errors; serde_json's own syntax
    // errors name a position only.
    let secrets: VolumeSecrets =
        serde_json::from_str(body).map_err(|e| Parse::Json(e.to_string()))?;
    if secrets.is_empty() {
        return Err(Parse::Text(SecretsTextError::Empty));
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_structs::SecretsUse;

    const MARKER: &str = "s3cr3t-VALUE-marker";

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }

    #[test]
    fn both_forms_read_and_exposed_files_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let kv = write(
            dir.path(),
            "kv",
            &format!("token={MARKER}\n[node-stage]\nkey=k\n"),
            0o600,
        );
        let json = write(
            dir.path(),
            "json",
            &format!("\n {{\"token\": \"{MARKER}\", \"node-stage\": {{\"key\": \"k\"}}}}"),
            0o640,
        );
        let a = read_secrets_file(&kv).expect("key=value");
        let b = read_secrets_file(&json).expect("json");
        assert_eq!(a, b);
        assert_eq!(a.for_use(SecretsUse::NodeStage).expose("key"), Some("k"));

        let open = write(dir.path(), "open", "token=x\n", 0o644);
        let err = read_secrets_file(&open).expect_err("readable by others");
        assert!(
            matches!(err, SecretsFileError::Exposed { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("0644"), "{err}");
        let writable = write(dir.path(), "writable", "token=x\n", 0o602);
        assert!(matches!(
            read_secrets_file(&writable),
            Err(SecretsFileError::Exposed { .. })
        ));
        assert!(matches!(
            read_secrets_file(dir.path()),
            Err(SecretsFileError::NotAFile { .. })
        ));
        assert!(matches!(
            read_secrets_file(&dir.path().join("missing")),
            Err(SecretsFileError::Io { .. })
        ));
    }

    #[test]
    fn broken_files_name_the_problem_never_a_value() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cases = [
            (format!("token={MARKER}\n{MARKER}\n"), "line 2"),
            (format!("{{\"token\": \"{MARKER}\""), "line 1"),
            (
                format!("{{\"token\": 12345, \"x\": \"{MARKER}\"}}"),
                "must be a string",
            ),
            ("{}".to_owned(), "no secrets"),
            ("\n# only a comment\n".to_owned(), "no secrets"),
            ("x".repeat(70_000), "the limit is 65536 bytes"),
        ];
        for (i, (text, expected)) in cases.iter().enumerate() {
            let path = write(dir.path(), &format!("f{i}"), text, 0o600);
            let err = read_secrets_file(&path).expect_err("refused").to_string();
            assert!(err.contains(expected), "{err}");
            assert!(!err.contains(MARKER) && !err.contains("12345"), "{err}");
        }
        let binary = dir.path().join("binary");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).expect("written");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(
            read_secrets_file(&binary),
            Err(SecretsFileError::NotText { .. })
        ));
    }
}
