//! Another agent's answers are input: a hostile one gets an error, never a panic.

use std::sync::Arc;

use csi_rpc_shim::{
    Credentials, GrpcCode, Health, Instance, ProtocolProblem, Registry, Routes, Scope, Shim,
    ShimConfig, ShimError, Token, TokenBook,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

use crate::support::*;

const DETAILS: &str = "grpc-status-details-bin";

/// Found by the `shim` campaign (csi-campaigns): tonic's client panicked on an answer whose
/// `grpc-status-details-bin` is not base64, in the caller's task (or a relay's connection).
#[tokio::test]
async fn details_that_are_not_base64_are_an_error_not_a_panic() {
    let cluster = Cluster::start(vec![AgentSpec::node("a")]).await;
    // Agent h knows no token, so it refuses a's call (an error with details); on the way out
    // its details are replaced with bytes that are not base64.
    let h = n("h");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ShimConfig::new(
        Credentials {
            node: h.clone(),
            token: Token::new(token_of("h")).unwrap(),
        },
        Scope::Node,
    );
    let hostile = Shim::new(
        config,
        Arc::new(Registry::new()),
        Arc::new(FakePlugins::new(&h)),
        TokenBook::new(),
        Routes::new(),
    );
    let corrupt = |mut answer: http::Response<tonic::body::Body>| {
        if answer.headers().contains_key(DETAILS) {
            answer
                .headers_mut()
                .insert(DETAILS, http::HeaderValue::from_static("!!not base64!!"));
        }
        answer
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(tower::util::MapResponseLayer::new(corrupt))
            .add_service(hostile.agent_service())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    cluster
        .registry
        .update(&h, &plugin(), Instance::Controller(Health::Healthy));
    let a = &cluster.agent("a").shim;
    a.update_routes(|r| r.set_direct(h.clone(), addr));

    let err = guarded(a.controller_detach(detach("vol-1", "a"), CALL))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ShimError::Protocol {
            rpc: csi_rpc_shim::AgentRpc::ControllerDetach,
            node: h,
            problem: ProtocolProblem::MissingDetail {
                code: GrpcCode::Unauthenticated
            },
        }
    );
}
