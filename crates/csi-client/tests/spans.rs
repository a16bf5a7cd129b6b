//! Spans and logs of csi-client name the call and never a secret.
//!
//! Its own test binary: the check installs a global `tracing` subscriber, which would race
//! with the callsite interest caching of tests running in parallel in a shared binary.

#[path = "client/support.rs"]
#[allow(dead_code)]
mod support;

use support::{Mock, guard};

#[tokio::test]
async fn spans_name_the_call_and_never_a_secret() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("csi_client=trace"))
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .expect("test invariant: this binary installs one subscriber");

    let mock = Mock::default().await;
    mock.faults()
        .on(csi_client::Rpc::NodeStageVolume)
        .fail(csi_client::Code::Internal, "backend hiccup")
        .install();
    let client =
        mock.client(|t| t.update(csi_client::Rpc::NodeStageVolume, |p| p.max_attempts = 1));
    let mut req = csi_client::proto::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: "/staging/vol-1".into(),
        volume_capability: Some(csi_client::proto::VolumeCapability {
            access_mode: Some(csi_client::proto::volume_capability::AccessMode { mode: 1 }),
            access_type: Some(csi_client::proto::volume_capability::AccessType::Block(
                Default::default(),
            )),
        }),
        ..Default::default()
    };
    req.secrets
        .insert("password".into(), "hunter2-secret".into());
    let err = guard(client.node().node_stage_volume(req))
        .await
        .unwrap_err();
    assert_eq!(err.class(), csi_client::ErrorClass::Uncertain);

    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("csi.call"), "{text}");
    assert!(
        text.contains("rpc=\"NodeStageVolume\"") || text.contains("rpc=NodeStageVolume"),
        "{text}"
    );
    assert!(text.contains("vol-1"), "{text}");
    assert!(text.contains("Internal"), "{text}");
    assert!(
        !text.contains("hunter2"),
        "a secret reached the logs: {text}"
    );
}
