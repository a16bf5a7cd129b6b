//! A plugin that answers badly, from a raw HTTP/2 server (gRPC cannot express most of these):
//! an HTTP error page, a message over the decode limit, bytes that are not gRPC, a status
//! number gRPC does not define, status details that are not base64. Each error must say what
//! really happened, with the class that fits: an answer we refused is never the plugin's
//! status, and is uncertain on a mutation and retryable on a read.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use csi_client::{Code, ErrorClass, ErrorKind, MAX_ANSWER_BYTES, ResponseError, proto};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::Frame;
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::support::{fast_policies, guard};

/// How the server answers every request.
#[derive(Clone, Debug)]
enum Bad {
    /// An HTTP error status with a text body and no gRPC headers.
    HttpError(u16),
    /// One well-framed message of this many bytes, then `grpc-status: 0`.
    Message(Vec<u8>),
    /// These well-framed messages one after the other, then `grpc-status: 0`.
    Messages(Vec<Vec<u8>>),
    /// A body that is not gRPC framing at all, then `grpc-status: 0`.
    Garbage,
    /// A trailers-only answer with these headers.
    TrailersOnly(Vec<(&'static str, &'static str)>),
}

/// A response body of scripted frames.
struct Scripted(VecDeque<Frame<Bytes>>);

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

fn ok_trailers() -> Frame<Bytes> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    Frame::trailers(trailers)
}

/// `message` as one gRPC frame: not compressed, its length, its bytes.
fn framed(message: &[u8]) -> Bytes {
    let length = u32::try_from(message.len()).expect("test invariant: under 4 GiB");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

fn answer(bad: &Bad) -> Response<Scripted> {
    let grpc = |frames: Vec<Frame<Bytes>>| {
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/grpc")
            .body(Scripted(frames.into()))
            .expect("test invariant: static headers are valid")
    };
    match bad {
        Bad::HttpError(status) => Response::builder()
            .status(*status)
            .header("content-type", "text/plain")
            .body(Scripted(
                vec![Frame::data(Bytes::from_static(b"internal server error"))].into(),
            ))
            .expect("test invariant: a valid status"),
        Bad::Message(message) => grpc(vec![Frame::data(framed(message)), ok_trailers()]),
        Bad::Messages(messages) => {
            let mut frames: Vec<_> = messages.iter().map(|m| Frame::data(framed(m))).collect();
            frames.push(ok_trailers());
            grpc(frames)
        }
        Bad::Garbage => grpc(vec![
            Frame::data(Bytes::from_static(b"hello, this is not gRPC")),
            ok_trailers(),
        ]),
        Bad::TrailersOnly(headers) => {
            let mut response = grpc(Vec::new());
            for (name, value) in headers {
                response
                    .headers_mut()
                    .insert(*name, HeaderValue::from_static(value));
            }
            response
        }
    }
}

/// A raw HTTP/2 server answering every request with `bad`; counts the requests.
struct BadServer {
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl BadServer {
    fn start(path: &Path, bad: Bad) -> BadServer {
        let listener = UnixListener::bind(path).expect("test invariant: the socket path is fresh");
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let bad = bad.clone();
                let counted = Arc::clone(&counted);
                let service = hyper::service::service_fn(move |_request| {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let response = answer(&bad);
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(async move {
                    // The client may reset a stream it refused; that ends nothing here.
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        BadServer { requests, task }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for BadServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plugin answering `bad`, and a client of it.
fn setup(bad: Bad) -> (tempfile::TempDir, BadServer, csi_client::CsiClient) {
    let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
    let path = dir.path().join("bad.sock");
    let server = BadServer::start(&path, bad);
    let client = csi_client::CsiClient::builder(
        csi_client::Endpoint::unix(&path).expect("test invariant: temp paths are short"),
    )
    .policies(fast_policies())
    .retry_budget(Arc::new(csi_client::RetryBudget::unlimited()))
    .build();
    (dir, server, client)
}

fn create_request() -> proto::CreateVolumeRequest {
    proto::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![
            (&csi_structs::VolumeCapability::block(csi_structs::AccessMode::SingleNodeWriter))
                .into(),
        ],
        ..Default::default()
    }
}

/// The errors of a read (GetPluginInfo) and a mutation (CreateVolume), each with the class a
/// failure without the plugin's status should have: retry, and uncertain.
async fn read_and_mutation(client: &csi_client::CsiClient) -> [(csi_client::Error, ErrorClass); 2] {
    let read = guard(client.identity().get_plugin_info())
        .await
        .unwrap_err();
    let mutation = guard(client.controller().create_volume(create_request()))
        .await
        .unwrap_err();
    [(read, ErrorClass::Retry), (mutation, ErrorClass::Uncertain)]
}

/// Runs a read and a mutation against `bad`, and checks that each failed once with an
/// unusable answer of the classes the rule gives, whose text has every part of `says` and no
/// sign of blaming the plugin's status.
async fn refused(bad: Bad, unusable: impl Fn(&ResponseError) -> bool, says: &[&str]) {
    let (_dir, server, client) = setup(bad.clone());
    for (err, class) in read_and_mutation(&client).await {
        let ErrorKind::InvalidResponse(what) = err.kind() else {
            panic!("{bad:?}: expected an unusable answer, got {err:?}");
        };
        assert!(unusable(what), "{bad:?}: {what:?}");
        assert_eq!(err.class(), class, "{bad:?}: {err}");
        assert_eq!(
            err.code(),
            None,
            "{bad:?}: the plugin sent no failure status"
        );
        assert_eq!(
            err.attempts(),
            1,
            "{bad:?}: an unusable answer is not retried"
        );
        let text = err.to_string();
        for part in says {
            assert!(text.contains(part), "{bad:?}: {text:?} lacks {part:?}");
        }
        assert!(
            !text.contains("plugin returned"),
            "{bad:?}: {text:?} blames the plugin's status"
        );
    }
    assert_eq!(server.requests(), 2, "{bad:?}: one request per call");
}

#[tokio::test]
async fn an_http_error_page_is_not_grpc_and_names_its_status() {
    refused(
        Bad::HttpError(500),
        |e| matches!(e, ResponseError::NotGrpc { http_status: 500 }),
        &["not a gRPC answer", "HTTP status 500"],
    )
    .await;
    refused(
        Bad::HttpError(503),
        |e| matches!(e, ResponseError::NotGrpc { http_status: 503 }),
        &["HTTP status 503"],
    )
    .await;
}

#[tokio::test]
async fn an_answer_over_the_decode_limit_names_its_size_and_the_limit() {
    let size = MAX_ANSWER_BYTES + 1;
    refused(
        Bad::Message(vec![0; size]),
        |e| {
            matches!(e, ResponseError::TooLarge { size: s, limit }
                if *s == size as u64 && *limit == MAX_ANSWER_BYTES)
        },
        &["4194305 bytes", "4194304-byte decode limit"],
    )
    .await;
}

#[tokio::test]
async fn an_answer_at_the_decode_limit_is_decoded() {
    // A GetPluginInfoResponse of exactly the limit: `name` (field 1) filling it, and
    // `vendor_version` (field 2) "1". It decodes, and fails only the name's own limit.
    let name_len = MAX_ANSWER_BYTES - 8;
    let mut message = vec![0x0a];
    let mut n = name_len;
    while n >= 0x80 {
        message.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    message.push(n as u8);
    message.resize(message.len() + name_len, b'x');
    message.extend_from_slice(&[0x12, 0x01, b'1']);
    assert_eq!(message.len(), MAX_ANSWER_BYTES);
    let (_dir, _server, client) = setup(Bad::Message(message));
    let err = guard(client.identity().get_plugin_info())
        .await
        .unwrap_err();
    let ErrorKind::InvalidResponse(ResponseError::Fields(errs)) = err.kind() else {
        panic!("expected the name's violation, got {err:?}");
    };
    assert_eq!(errs.violations()[0].field.to_string(), "name");
}

#[tokio::test]
async fn bytes_that_are_not_grpc_are_undecodable() {
    refused(
        Bad::Garbage,
        |e| matches!(e, ResponseError::Undecodable { .. }),
        &["undecodable answer"],
    )
    .await;
    // Well framed, but not the protobuf message asked for.
    refused(
        Bad::Message(vec![0xff; 7]),
        |e| matches!(e, ResponseError::Undecodable { .. }),
        &["undecodable answer"],
    )
    .await;
    // OK without a message.
    refused(
        Bad::TrailersOnly(vec![("grpc-status", "0")]),
        |e| matches!(e, ResponseError::Undecodable { .. }),
        &["undecodable answer"],
    )
    .await;
    refused(
        Bad::TrailersOnly(vec![("grpc-status", "x1")]),
        |e| matches!(e, ResponseError::Undecodable { detail } if detail.contains("grpc-status")),
        &["not a decimal number"],
    )
    .await;
}

#[tokio::test]
async fn a_unary_answer_with_two_messages_is_undecodable() {
    // Found by the client campaign: tonic took the first message and dropped the second, so
    // an answer that contradicts itself passed as success. Both messages here are valid
    // (empty) messages of any answer type; the client must not pick one.
    refused(
        Bad::Messages(vec![Vec::new(), Vec::new()]),
        |e| matches!(e, ResponseError::Undecodable { detail } if detail.contains("2 messages")),
        &["undecodable answer", "holds 2 messages"],
    )
    .await;
}

#[tokio::test]
async fn an_unknown_status_code_shows_its_number() {
    let (_dir, _server, client) = setup(Bad::TrailersOnly(vec![
        ("grpc-status", "99"),
        ("grpc-message", "boom"),
    ]));
    for (err, class) in read_and_mutation(&client).await {
        assert!(
            matches!(err.kind(), ErrorKind::UnknownStatus { number: 99, message } if message == "boom"),
            "{err:?}"
        );
        // Treated as UNKNOWN, and said to be the plugin's.
        assert_eq!(err.code(), Some(Code::Unknown));
        assert_eq!(err.message(), Some("boom"));
        assert_eq!(err.class(), class, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("plugin returned unknown status code 99: boom"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn status_details_that_are_not_base64_do_not_panic() {
    // tonic panics on such a value; the client drops the details it never reads.
    let (_dir, _server, client) = setup(Bad::TrailersOnly(vec![
        ("grpc-status", "5"),
        ("grpc-message", "gone"),
        ("grpc-status-details-bin", "!!!"),
    ]));
    let err = guard(client.identity().get_plugin_info())
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Status { code: Code::NotFound, message } if message == "gone"),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
}

/// The violations of an invalid answer, as (field, problem).
fn violations(err: &csi_client::Error) -> Vec<(String, csi_structs::Problem)> {
    let ErrorKind::InvalidResponse(ResponseError::Fields(errs)) = err.kind() else {
        panic!("expected an invalid answer naming its fields, got {err:?}");
    };
    errs.violations()
        .iter()
        .map(|v| (v.field.to_string(), v.problem.clone()))
        .collect()
}

#[tokio::test]
async fn a_negative_size_after_expansion_is_refused_naming_the_field() {
    use csi_structs::{CapacityRange, ExternalVolumeId, Problem, Secrets};
    use prost::Message;

    let negative = proto::ControllerExpandVolumeResponse {
        capacity_bytes: -(1 << 30),
        node_expansion_required: true,
    };
    let (dir, server, client) = setup(Bad::Message(negative.encode_to_vec()));
    let volume = ExternalVolumeId::new("vol-1").unwrap();
    let range = CapacityRange::at_least(1 << 30).unwrap();
    let err = guard(
        client
            .controller()
            .expand(&volume, &range, None, &Secrets::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(
        violations(&err),
        [(
            "capacity_bytes".to_owned(),
            Problem::Negative { value: -(1 << 30) }
        )]
    );
    // A mutation whose answer could not be used: it may have happened.
    assert_eq!(err.class(), ErrorClass::Uncertain, "{err}");
    assert_eq!(err.attempts(), 1);
    assert!(err.to_string().contains("vol-1"), "{err}");

    // The same bytes decode as a NodeExpandVolumeResponse of that size (field 1).
    let path = dir.path().join("target");
    let err = guard(client.node().expand(&csi_client::NodeExpand {
        volume: &volume,
        volume_path: &path,
        staging_target_path: None,
        capacity_range: Some(&range),
        capability: None,
        secrets: &Secrets::default(),
    }))
    .await
    .unwrap_err();
    assert_eq!(
        violations(&err),
        [(
            "capacity_bytes".to_owned(),
            Problem::Negative { value: -(1 << 30) }
        )]
    );
    assert_eq!(err.class(), ErrorClass::Uncertain, "{err}");
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn a_bad_published_node_id_in_get_volume_is_refused_naming_it() {
    use csi_structs::{ExternalVolumeId, Problem};
    use prost::Message;

    let answer = proto::ControllerGetVolumeResponse {
        volume: Some(proto::Volume {
            volume_id: "vol-1".into(),
            capacity_bytes: 1 << 30,
            ..Default::default()
        }),
        status: Some(proto::controller_get_volume_response::VolumeStatus {
            published_node_ids: vec!["node-a".into(), String::new()],
            volume_condition: None,
        }),
    };
    let (_dir, _server, client) = setup(Bad::Message(answer.encode_to_vec()));
    let err = guard(
        client
            .controller()
            .get_volume(&ExternalVolumeId::new("vol-1").unwrap()),
    )
    .await
    .unwrap_err();
    assert_eq!(
        violations(&err),
        [("status.published_node_ids[1]".to_owned(), Problem::Missing)]
    );
    // A read whose answer was unusable may be asked again.
    assert_eq!(err.class(), ErrorClass::Retry, "{err}");
}

#[tokio::test]
async fn a_bad_entry_in_list_volumes_is_refused_naming_its_place() {
    use csi_structs::Problem;
    use prost::Message;

    let volume = |id: &str| {
        Some(proto::Volume {
            volume_id: id.into(),
            capacity_bytes: 1 << 30,
            ..Default::default()
        })
    };
    // One page: an entry without status (allowed), then one naming an empty node.
    let page = proto::ListVolumesResponse {
        entries: vec![
            proto::list_volumes_response::Entry {
                volume: volume("vol-1"),
                status: None,
            },
            proto::list_volumes_response::Entry {
                volume: volume("vol-2"),
                status: Some(proto::list_volumes_response::VolumeStatus {
                    published_node_ids: vec!["node-a".into(), String::new()],
                    volume_condition: None,
                }),
            },
        ],
        next_token: String::new(),
    };
    let (_dir, server, client) = setup(Bad::Message(page.encode_to_vec()));
    let err = guard(client.controller().list_all_volumes_with_status(0))
        .await
        .unwrap_err();
    assert_eq!(
        violations(&err),
        [(
            "entries[1].status.published_node_ids[1]".to_owned(),
            Problem::Missing
        )]
    );
    // A read whose answer was unusable may be asked again.
    assert_eq!(err.class(), ErrorClass::Retry, "{err}");
    assert!(err.to_string().contains("ListVolumes"), "{err}");
    assert_eq!(server.requests(), 1);

    // An entry without a volume is refused with the page, naming it.
    let page = proto::ListVolumesResponse {
        entries: vec![proto::list_volumes_response::Entry {
            volume: None,
            status: None,
        }],
        next_token: String::new(),
    };
    let (_dir, _server, client) = setup(Bad::Message(page.encode_to_vec()));
    let err = guard(client.controller().list_all_volumes_with_status(0))
        .await
        .unwrap_err();
    assert_eq!(
        violations(&err),
        [("entries[0].volume".to_owned(), Problem::Missing)]
    );
}
