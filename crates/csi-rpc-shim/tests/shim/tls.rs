//! TLS between agents (feature `tls`): certificates made at test time, shims over loopback.
//!
//! Failures are checked by their kind, never by how long they took: every call runs under the
//! hang guard, and "refused at once" means "a connection error, not the deadline".

use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{AgentRpc, PemInput, ShimError, TlsConfig, TlsConfigError};
use csi_structs::ErrorClass;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tonic::transport::{ClientTlsConfig, Endpoint, Identity};

use crate::support::*;

/// A certificate authority made for one test.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// One agent's certificate and key, PEM.
struct NodeCert {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `node` naming `names` (IP addresses or DNS names), usable on both
    /// sides of a link.
    fn issue(&self, node: &str, names: &[&str]) -> NodeCert {
        let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, node);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        NodeCert {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// The certificate agents are dialled by: the loopback address they listen on.
    fn node(&self, node: &str) -> NodeCert {
        self.issue(node, &["127.0.0.1", &format!("{node}.agents.test")])
    }

    /// Mutual TLS for `node`, trusting this CA.
    fn config(&self, node: &str) -> TlsConfig {
        let c = self.node(node);
        TlsConfig::from_pem(self.pem(), &c.cert, &c.key).unwrap()
    }
}

/// A raw client of the agent protocol over TLS, for calls a correct shim never makes.
async fn raw_tls_client(
    addr: std::net::SocketAddr,
    tls: &TlsConfig,
) -> pb::agent_client::AgentClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls.client.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    pb::agent_client::AgentClient::new(channel)
}

fn raw_node_detach(node: &str) -> pb::NodeDetachRequest {
    pb::NodeDetachRequest {
        plugin_id: "ebs".into(),
        volume_id: "vol-1".into(),
        external_volume_id: "ext-vol-1".into(),
        node_id: node.into(),
        workload_id: "alloc-1".into(),
        capability: Some(pb::Capability {
            access_mode: 1,
            access_type: pb::AccessType::Block as i32,
            ..Default::default()
        }),
        read_only: false,
    }
}

#[tokio::test]
async fn a_relayed_call_works_end_to_end_over_tls() {
    let ca = Ca::new("agents");
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").via("c", "b").tls(ca.config("a")),
        AgentSpec::node("b").tls(ca.config("b")),
        AgentSpec::node("c").tls(ca.config("c")),
    ])
    .await;
    cluster.controllers_on(&["c"]);
    // a -> b and b -> c are both TLS links.
    let out = guarded(
        cluster
            .agent("a")
            .shim
            .controller_attach(attach("vol-1", "a"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(out.publish_context.get("served_by"), Some("c"));
    assert_eq!(cluster.agent("b").shim.stats().relayed, 1);
    let seen = cluster.agent("c").plugins.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].ctx.origin, n("a"));
    assert_eq!(seen[0].ctx.hops, 1);
    // The secrets crossed both encrypted links intact.
    assert_eq!(seen[0].secrets.as_ref(), Some(&secrets()));
}

#[tokio::test]
async fn a_direct_call_reaches_the_target_over_tls() {
    let ca = Ca::new("agents");
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").tls(ca.config("ops")),
        AgentSpec::node("b").tls(ca.config("b")),
    ])
    .await;
    guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["b"]);
    assert_eq!(cluster.agent("ops").shim.stats().sent, 1);
    assert_eq!(cluster.agent("b").shim.stats().received, 1);
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_is_refused_and_the_server_keeps_serving() {
    let ours = Ca::new("agents");
    let theirs = Ca::new("somebody else");
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("stranger").tls(theirs.config("stranger")),
        AgentSpec::cluster("ops").tls(ours.config("ops")),
        AgentSpec::node("b").tls(ours.config("b")),
    ])
    .await;
    // The stranger's TLS handshake fails on b's certificate: nothing was sent, so the call
    // is a plain "unreachable" (retry), not "uncertain", and no deadline was needed.
    let err = guarded(
        cluster
            .agent("stranger")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::PeerUnreachable {
            rpc: AgentRpc::NodeDetach,
            node: n("b")
        }
    );
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());

    // b still serves an agent that trusts its CA.
    guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["b"]);
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let ours = Ca::new("agents");
    let theirs = Ca::new("somebody else");
    // Trusts our CA (so b's certificate is fine) but presents a certificate we did not sign.
    let foreign = theirs.node("stranger");
    let mut tls = theirs.config("stranger");
    tls.client = ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ours.pem()))
        .identity(Identity::from_pem(&foreign.cert, &foreign.key));
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("stranger").tls(tls),
        AgentSpec::node("b").tls(ours.config("b")),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("stranger")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    // With TLS 1.3 the client may finish its side of the handshake before b refuses the
    // certificate, so either connection error is correct; the deadline is not.
    assert!(
        matches!(
            &err,
            ShimError::PeerUnreachable { rpc: AgentRpc::NodeDetach, node }
                | ShimError::PeerLost { rpc: AgentRpc::NodeDetach, node } if *node == n("b")
        ),
        "{err:?}"
    );
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());
}

#[tokio::test]
async fn a_plaintext_client_against_a_tls_server_fails() {
    let ca = Ca::new("agents");
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("plain"),
        AgentSpec::node("b").tls(ca.config("b")),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("plain")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            &err,
            ShimError::PeerUnreachable { rpc: AgentRpc::NodeDetach, node }
                | ShimError::PeerLost { rpc: AgentRpc::NodeDetach, node } if *node == n("b")
        ),
        "{err:?}"
    );

    // A raw plaintext request with valid credentials gets no answer from the service either.
    let channel = Endpoint::from_shared(format!("http://{}", cluster.agent("b").addr))
        .unwrap()
        .connect_lazy();
    let mut raw = pb::agent_client::AgentClient::new(channel);
    let status =
        guarded(raw.node_detach(with_creds(raw_node_detach("b"), "b", &token_of("b"), None)))
            .await
            .unwrap_err();
    assert!(
        !matches!(
            status.code(),
            tonic::Code::Ok | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{status:?}"
    );
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());
}

#[tokio::test]
async fn a_tls_client_against_a_plaintext_server_fails_before_sending() {
    let ca = Ca::new("agents");
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").tls(ca.config("ops")),
        AgentSpec::node("b"),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::PeerUnreachable {
            rpc: AgentRpc::NodeDetach,
            node: n("b")
        }
    );
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
}

#[tokio::test]
async fn tokens_and_node_scope_are_still_checked_over_tls() {
    let ca = Ca::new("agents");
    let wrong = "not-the-token-of-a-000000";
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").presenting(wrong).tls(ca.config("a")),
        AgentSpec::node("b").tls(ca.config("b")),
        AgentSpec::node("c").tls(ca.config("c")),
    ])
    .await;
    cluster.controllers_on(&["b"]);

    // A valid certificate does not stand in for the token.
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .controller_detach(detach("vol-1", "a"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::Unauthenticated {
            rpc: AgentRpc::ControllerDetach,
            node: n("b")
        }
    );
    assert!(!err.to_string().contains(wrong));
    assert!(cluster.served(AgentRpc::ControllerDetach).is_empty());

    // Over a raw TLS link with a's certificate: no token, another node's token, and a's own
    // token acting for node c are all refused by c; c's own credentials go through.
    let a_tls = ca.config("a");
    let mut to_c = raw_tls_client(cluster.agent("c").addr, &a_tls).await;
    let status = to_c
        .node_detach(tonic::Request::new(raw_node_detach("c")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = to_c
        .node_detach(with_creds(raw_node_detach("c"), "a", &token_of("b"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = to_c
        .node_detach(with_creds(raw_node_detach("c"), "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(detail(&status).kind, pb::ErrorKind::PermissionDenied as i32);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());

    to_c.node_detach(with_creds(raw_node_detach("c"), "c", &token_of("c"), None))
        .await
        .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["c"]);
}

#[tokio::test]
async fn the_peer_certificate_must_name_the_address_dialled_or_the_server_name() {
    let ca = Ca::new("agents");
    // Certificates that name only a shared DNS name, not 127.0.0.1.
    let shared = |node: &str| {
        let c = ca.issue(node, &["agents.test"]);
        TlsConfig::from_pem(ca.pem(), &c.cert, &c.key).unwrap()
    };
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("by-address").tls(shared("by-address")),
        AgentSpec::cluster("by-name")
            .tls(shared("by-name").with_server_name("agents.test").unwrap()),
        AgentSpec::node("b").tls(shared("b")),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("by-address")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::PeerUnreachable {
            rpc: AgentRpc::NodeDetach,
            node: n("b")
        }
    );
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());
    guarded(
        cluster
            .agent("by-name")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["b"]);
}

#[test]
fn from_pem_names_the_bad_input_and_checks_the_key_against_the_certificate() {
    let ca = Ca::new("agents");
    let a = ca.node("a");
    let b = ca.node("b");
    let err = TlsConfig::from_pem(ca.pem(), &a.cert, "").unwrap_err();
    assert!(
        matches!(
            err,
            TlsConfigError::NotFound {
                input: PemInput::PrivateKey
            }
        ),
        "{err:?}"
    );
    // The key where the certificate belongs.
    let err = TlsConfig::from_pem(ca.pem(), &a.key, &a.key).unwrap_err();
    assert!(
        matches!(
            err,
            TlsConfigError::NotFound {
                input: PemInput::Certificate
            }
        ),
        "{err:?}"
    );
    // b's key with a's certificate.
    let err = TlsConfig::from_pem(ca.pem(), &a.cert, &b.key).unwrap_err();
    assert!(
        matches!(
            err,
            TlsConfigError::Client { .. } | TlsConfigError::Server { .. }
        ),
        "{err:?}"
    );
    let err = ca.config("a").with_server_name("not a name!").unwrap_err();
    assert!(
        matches!(&err, TlsConfigError::ServerName { name } if name == "not a name!"),
        "{err:?}"
    );
}

#[test]
fn the_private_key_is_never_printed() {
    let ca = Ca::new("agents");
    let a = ca.node("a");
    let tls = TlsConfig::from_pem(ca.pem(), &a.cert, &a.key).unwrap();
    let mut config = csi_rpc_shim::ShimConfig::new(
        csi_rpc_shim::Credentials {
            node: n("a"),
            token: csi_rpc_shim::Token::new(token_of("a")).unwrap(),
        },
        csi_rpc_shim::Scope::Node,
    );
    config.tls = Some(tls.clone());
    // The key as PEM text, and as the byte list a derived `Debug` of a `Vec<u8>` prints.
    let body: String = a.key.lines().filter(|l| !l.starts_with("-----")).collect();
    let bytes = format!("{:?}", a.key.as_bytes());
    let bytes = &bytes[1..bytes.len() - 1];
    for shown in [format!("{tls:?}"), format!("{config:?}")] {
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        assert!(!shown.contains(&body[..32]), "{shown}");
        assert!(!shown.contains(bytes), "{shown}");
    }
}
