//! Another agent's answers are input: a hostile one gets an error, never a panic.

use std::sync::Arc;

use csi_rpc_shim::wire::MAX_MESSAGE_BYTES;
use csi_rpc_shim::{
    ControllerQuery, Credentials, GrpcCode, Health, Instance, ListVolumes, ListedVolume,
    ProtocolProblem, Routes, Scope, Shim, ShimConfig, ShimError, Token, TokenBook, VolumePage,
};
use csi_structs::ExternalVolumeId;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

use crate::support::*;

const DETAILS: &str = "grpc-status-details-bin";

/// Agent h (book `book`, plugins `plugins`), the only controller of `ebs`, and a's route to
/// it; the caller serves h's router on the listener however it likes.
fn hostile_agent(
    cluster: &Cluster,
    book: TokenBook,
    plugins: Arc<FakePlugins>,
    listener: &TcpListener,
) -> Shim {
    let h = n("h");
    let config = ShimConfig::new(
        Credentials {
            node: h.clone(),
            token: Token::new(token_of("h")).unwrap(),
        },
        Scope::Node,
    );
    let shim = Shim::new(
        config,
        cluster.registry.clone(),
        plugins,
        book,
        Routes::new(),
    );
    cluster
        .registry
        .update(&h, &plugin(), Instance::Controller(Health::Healthy));
    let addr = listener.local_addr().unwrap();
    cluster
        .agent("a")
        .shim
        .update_routes(|r| r.set_direct(h, addr));
    shim
}

/// Found by the `shim` campaign (csi-campaigns): tonic's client panicked on an answer whose
/// `grpc-status-details-bin` is not base64, in the caller's task (or a relay's connection).
#[tokio::test]
async fn details_that_are_not_base64_are_an_error_not_a_panic() {
    let cluster = Cluster::start(vec![AgentSpec::node("a")]).await;
    // Agent h knows no token, so it refuses a's call (an error with details); on the way out
    // its details are replaced with bytes that are not base64.
    let h = n("h");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hostile = hostile_agent(
        &cluster,
        TokenBook::new(),
        Arc::new(FakePlugins::new(&h)),
        &listener,
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
    let a = &cluster.agent("a").shim;

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

/// Found by the `shim` campaign: `MAX_MESSAGE_BYTES` capped what an agent received as a
/// server, but an answer to one of its own calls was read up to tonic's default (4 MiB).
#[tokio::test]
async fn an_answer_over_the_message_limit_is_refused() {
    let cluster = Cluster::start(vec![AgentSpec::node("a")]).await;
    // Agent h sends whatever its plugin answers: a correct agent would refuse to encode a
    // page this large; h was built without that cap.
    let h = n("h");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut book = TokenBook::new();
    book.insert(n("a"), Token::new(token_of("a")).unwrap(), Scope::Node);
    let plugins = Arc::new(FakePlugins::new(&h));
    let entry = |i: usize| ListedVolume {
        external_volume: ExternalVolumeId::new(format!("vol-{i:0>100}")).unwrap(),
        capacity_bytes: 1,
        published_nodes: Vec::new(),
    };
    plugins.set_volume_page(VolumePage {
        entries: (0..MAX_MESSAGE_BYTES / 100 + 1).map(entry).collect(),
        next_token: String::new(),
    });
    let hostile = hostile_agent(&cluster, book, plugins.clone(), &listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                hostile
                    .agent_service()
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let a = &cluster.agent("a").shim;

    let list = ListVolumes {
        query: ControllerQuery::new(plugin()),
        max_entries: 0,
        starting_token: String::new(),
    };
    let err = guarded(a.list_volumes(list, CALL)).await.unwrap_err();
    assert_eq!(
        plugins.calls(csi_rpc_shim::AgentRpc::ControllerListVolumes),
        1
    );
    // tonic refuses to decode it (OUT_OF_RANGE, no detail): an answer outside the protocol.
    assert_eq!(
        err,
        ShimError::Protocol {
            rpc: csi_rpc_shim::AgentRpc::ControllerListVolumes,
            node: h,
            problem: ProtocolProblem::MissingDetail {
                code: GrpcCode::OutOfRange
            },
        }
    );
}
