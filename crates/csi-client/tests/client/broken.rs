//! A plugin that breaks the call's connection, from a raw HTTP/2 server: it resets the stream,
//! goes away (GOAWAY), or sends the answer's headers and then closes the connection. Each
//! error must say in words what the plugin did, with the RPC and the class the rules give
//! (uncertain on a mutation), and never the transport library's Debug text.

use std::future::poll_fn;
use std::path::Path;
use std::sync::Arc;

use csi_client::{ErrorClass, ErrorKind, H2Code, TransportFault, proto};
use h2::Reason;
use http::{Response, StatusCode};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::support::{fast_policies, guard};

/// What the server does with every request.
#[derive(Clone, Copy, Debug)]
enum Break {
    /// Resets the request's stream with INTERNAL_ERROR.
    Reset,
    /// Sends GOAWAY with INTERNAL_ERROR, naming no stream as processed, and closes the
    /// connection (written frame by frame: h2's server names the streams it received).
    GoAway,
    /// Sends the answer's headers, waits until the client has read them, then closes the
    /// connection.
    HeadersThenClose,
}

struct BreakingServer {
    task: JoinHandle<()>,
}

impl Drop for BreakingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A frame's 9-byte header: length, type, flags, stream id.
fn frame_header(length: u32, kind: u8, stream: u32) -> Vec<u8> {
    let mut header = length.to_be_bytes()[1..].to_vec();
    header.push(kind);
    header.push(0);
    header.extend_from_slice(&stream.to_be_bytes());
    header
}

/// Reads the client's preface and frames until a HEADERS frame (the request) arrives, then
/// sends GOAWAY with last stream 0 and INTERNAL_ERROR and closes.
async fn go_away(mut stream: tokio::net::UnixStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SETTINGS: u8 = 0x4;
    const HEADERS: u8 = 0x1;
    const GOAWAY: u8 = 0x7;
    let mut preface = [0u8; 24];
    if stream.read_exact(&mut preface).await.is_err()
        || stream
            .write_all(&frame_header(0, SETTINGS, 0))
            .await
            .is_err()
    {
        return;
    }
    loop {
        let mut header = [0u8; 9];
        if stream.read_exact(&mut header).await.is_err() {
            return;
        }
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        if stream.read_exact(&mut payload).await.is_err() {
            return;
        }
        if header[3] == HEADERS {
            break;
        }
    }
    let mut frame = frame_header(8, GOAWAY, 0);
    frame.extend_from_slice(&0u32.to_be_bytes());
    frame.extend_from_slice(&u32::from(Reason::INTERNAL_ERROR).to_be_bytes());
    let _ = stream.write_all(&frame).await;
    let _ = stream.shutdown().await;
}

async fn serve_connection(stream: tokio::net::UnixStream, how: Break) {
    if let Break::GoAway = how {
        return go_away(stream).await;
    }
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    let Some(mut ping) = conn.ping_pong() else {
        return;
    };
    while let Some(Ok((_request, mut respond))) = conn.accept().await {
        match how {
            Break::Reset => respond.send_reset(Reason::INTERNAL_ERROR),
            Break::GoAway => return,
            Break::HeadersThenClose => {
                let head = Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/grpc")
                    .body(())
                    .expect("test invariant: static headers are valid");
                if respond.send_response(head, false).is_err() {
                    return;
                }
                // The client answers the ping after it has read the headers sent before it.
                tokio::select! {
                    _ = ping.ping(h2::Ping::opaque()) => {}
                    _ = poll_fn(|cx| conn.poll_closed(cx)) => {}
                }
                // Dropping the connection closes the socket: the answer never ends.
                return;
            }
        }
    }
}

fn start(path: &Path, how: Break) -> BreakingServer {
    let listener = UnixListener::bind(path).expect("test invariant: the socket path is fresh");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, how));
        }
    });
    BreakingServer { task }
}

/// The error of one CreateVolume against a server that breaks it `how`.
async fn create_against(how: Break) -> csi_client::Error {
    let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
    let path = dir.path().join("broken.sock");
    let _server = start(&path, how);
    let client = csi_client::CsiClient::builder(
        csi_client::Endpoint::unix(&path).expect("test invariant: temp paths are short"),
    )
    .policies(fast_policies())
    .retry_budget(Arc::new(csi_client::RetryBudget::unlimited()))
    .build();
    let request = proto::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![
            (&csi_structs::VolumeCapability::block(csi_structs::AccessMode::SingleNodeWriter))
                .into(),
        ],
        ..Default::default()
    };
    guard(client.controller().create_volume(request))
        .await
        .unwrap_err()
}

/// The error's text names the RPC, the class and `says`, and holds no Debug text of a
/// transport error.
fn reads_in_words(err: &csi_client::Error, says: &str) {
    let text = err.to_string();
    for part in ["CreateVolume", "lost mid-call", "uncertain", says] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
    for debug in [
        "Error {",
        "kind:",
        "Reset(",
        "GoAway(",
        "h2 protocol error",
        "source:",
    ] {
        assert!(!text.contains(debug), "{text:?} holds {debug:?}");
    }
    assert_eq!(err.class(), ErrorClass::Uncertain, "{text}");
    assert_eq!(err.code(), None, "{text}: the plugin sent no status");
}

#[tokio::test]
async fn a_stream_the_plugin_resets_reads_as_a_reset_in_words() {
    let err = create_against(Break::Reset).await;
    assert!(
        matches!(
            err.kind(),
            ErrorKind::ConnectionLost {
                fault: TransportFault::StreamReset {
                    code: H2Code(2),
                    after_headers: false
                }
            }
        ),
        "{err:?}"
    );
    reads_in_words(
        &err,
        "the plugin reset the call's stream (HTTP/2 INTERNAL_ERROR)",
    );
}

#[tokio::test]
async fn a_plugin_that_goes_away_reads_as_gone_away_in_words() {
    let err = create_against(Break::GoAway).await;
    assert!(
        matches!(
            err.kind(),
            ErrorKind::ConnectionLost {
                fault: TransportFault::GoAway {
                    code: H2Code(2),
                    after_headers: false
                }
            }
        ),
        "{err:?}"
    );
    reads_in_words(&err, "the plugin went away (HTTP/2 GOAWAY, INTERNAL_ERROR)");
}

#[tokio::test]
async fn headers_and_then_a_closed_connection_read_as_such() {
    let err = create_against(Break::HeadersThenClose).await;
    assert!(
        matches!(
            err.kind(),
            ErrorKind::ConnectionLost {
                fault: TransportFault::Closed {
                    after_headers: true
                }
            }
        ),
        "{err:?}"
    );
    reads_in_words(
        &err,
        "the plugin sent the answer's headers and then nothing: the connection closed",
    );
}
