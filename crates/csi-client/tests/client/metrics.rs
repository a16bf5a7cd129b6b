//! The tower layer hook and the metrics layer against the mock plugin: one record per
//! attempt with the plugin's code (trailers and trailers-only answers), transport errors and
//! dropped calls as outcomes of their own, the Prometheus text, and user layers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use csi_client::metrics::{InMemoryMetrics, MetricsLayer, RpcOutcome};
use csi_client::{Code, CsiClient, CsiClientBuilder, RetryBudget, Rpc};

use crate::support::{Mock, eventually, fast_policies, guard};

fn builder(mock: &Mock) -> CsiClientBuilder {
    CsiClient::builder(mock.endpoint())
        .policies(fast_policies())
        .retry_budget(Arc::new(RetryBudget::unlimited()))
}

fn with_metrics(mock: &Mock) -> (CsiClient, Arc<InMemoryMetrics>) {
    let metrics = Arc::new(InMemoryMetrics::new());
    let client = builder(mock)
        .layer(MetricsLayer::new(metrics.clone()))
        .build();
    (client, metrics)
}

const OK: RpcOutcome = RpcOutcome::Status(Code::Ok);

#[tokio::test]
async fn successes_are_counted_per_rpc_and_code() {
    let mock = Mock::default().await;
    let (client, metrics) = with_metrics(&mock);
    guard(client.identity().probe()).await.unwrap();
    guard(client.identity().probe()).await.unwrap();
    guard(client.identity().get_plugin_info()).await.unwrap();

    assert_eq!(metrics.count(Rpc::Probe, OK), 2);
    assert_eq!(metrics.count(Rpc::GetPluginInfo, OK), 1);
    assert_eq!(metrics.requests(Rpc::Probe), 2);
    assert_eq!(metrics.histogram(Rpc::Probe).count(), 2);
    // Nothing else was recorded: no other RPC, no other outcome.
    assert_eq!(
        metrics.counts(),
        vec![(Rpc::GetPluginInfo, OK, 1), (Rpc::Probe, OK, 2)]
    );
}

#[tokio::test]
async fn a_retried_call_is_one_record_per_attempt() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(1, Code::Unavailable, "busy")
        .install();
    let (client, metrics) = with_metrics(&mock);
    guard(client.node().node_get_capabilities()).await.unwrap();

    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 2);
    assert_eq!(
        metrics.count(
            Rpc::NodeGetCapabilities,
            RpcOutcome::Status(Code::Unavailable)
        ),
        1
    );
    assert_eq!(metrics.count(Rpc::NodeGetCapabilities, OK), 1);
    assert_eq!(metrics.requests(Rpc::NodeGetCapabilities), 2);
}

#[tokio::test]
async fn an_error_code_is_recorded_as_sent() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetInfo)
        .fail(Code::NotFound, "no such node")
        .install();
    let (client, metrics) = with_metrics(&mock);
    let err = guard(client.node().node_get_info()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound));

    let not_found = RpcOutcome::Status(Code::NotFound);
    assert_eq!(metrics.count(Rpc::NodeGetInfo, not_found), 1);
    assert_eq!(
        metrics.requests(Rpc::NodeGetInfo),
        u64::from(err.attempts())
    );
    assert_eq!(metrics.count(Rpc::NodeGetInfo, OK), 0);
}

#[tokio::test]
async fn a_lost_connection_is_a_transport_error() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetInfo)
        .drop_connection()
        .install();
    let (client, metrics) = with_metrics(&mock);
    let opts = csi_client::CallOptions::new().max_attempts(1);
    // Connect first, so the dropped connection is one the layer already wraps.
    guard(client.identity().probe()).await.unwrap();
    let err = guard(client.node().with_options(opts).node_get_info())
        .await
        .unwrap_err();
    assert_eq!(err.code(), None, "{err:?}");
    assert_eq!(metrics.count(Rpc::NodeGetInfo, RpcOutcome::Transport), 1);
    assert_eq!(metrics.requests(Rpc::NodeGetInfo), 1);
}

#[tokio::test]
async fn a_cancelled_call_is_recorded_as_dropped() {
    let mock = Mock::default().await;
    mock.faults().on(Rpc::NodeGetInfo).hang().install();
    let (client, metrics) = with_metrics(&mock);
    let node = client.node();
    let call = tokio::spawn(async move { node.node_get_info().await });
    // Cancel only once the plugin holds the request.
    assert!(eventually(|| mock.count(Rpc::NodeGetInfo) == 1).await);
    assert_eq!(metrics.requests(Rpc::NodeGetInfo), 0);
    call.abort();
    assert!(guard(call).await.is_err_and(|e| e.is_cancelled()));

    assert_eq!(metrics.count(Rpc::NodeGetInfo, RpcOutcome::Dropped), 1);
    assert_eq!(metrics.requests(Rpc::NodeGetInfo), 1);
    mock.faults().release_hung();
}

#[tokio::test]
async fn concurrent_first_calls_dial_once_through_the_layer() {
    let mock = Mock::default().await;
    let (client, metrics) = with_metrics(&mock);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let identity = client.identity();
            tokio::spawn(async move { identity.probe().await })
        })
        .collect();
    for call in calls {
        guard(call).await.unwrap().unwrap();
    }
    assert_eq!(client.connection().dial_attempts(), 1);
    assert_eq!(metrics.count(Rpc::Probe, OK), 8);
}

/// A strict reader of the exposition: every line is a `# HELP`/`# TYPE` comment or
/// `name{labels} value`; returns the samples by series.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.split(' ');
            let kind = words.next();
            assert!(matches!(kind, Some("HELP" | "TYPE")), "{line}");
            let family = words.next().unwrap_or_default();
            assert!(family.starts_with("csi_rpc_"), "{line}");
            if kind == Some("TYPE") {
                assert!(
                    matches!(words.next(), Some("histogram" | "counter")),
                    "{line}"
                );
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
        let (name, labels) = series.split_once('{').unwrap_or_else(|| panic!("{line}"));
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
        for pair in labels.split(',') {
            let (key, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
            assert!(matches!(key, "rpc" | "code" | "le"), "{line}");
            assert!(
                quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'),
                "{line}"
            );
        }
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

#[tokio::test]
async fn the_rendered_text_parses_and_adds_up() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetInfo)
        .fail(Code::NotFound, "no such node")
        .install();
    let (client, metrics) = with_metrics(&mock);
    guard(client.identity().probe()).await.unwrap();
    guard(client.identity().probe()).await.unwrap();
    guard(client.node().node_get_info()).await.unwrap_err();

    let text = metrics.render_prometheus();
    let samples = parse(&text);
    assert_eq!(samples[r#"csi_rpc_total{rpc="Probe",code="Ok"}"#], 2.0);
    assert_eq!(
        samples[r#"csi_rpc_total{rpc="NodeGetInfo",code="NotFound"}"#],
        1.0
    );
    assert_eq!(
        samples[r#"csi_rpc_duration_seconds_count{rpc="Probe"}"#],
        2.0
    );
    assert_eq!(
        samples[r#"csi_rpc_duration_seconds_count{rpc="NodeGetInfo"}"#],
        1.0
    );
    for rpc in ["Probe", "NodeGetInfo"] {
        let mut previous = 0.0;
        for bound in csi_client::metrics::LATENCY_BUCKETS {
            let key = format!(
                r#"csi_rpc_duration_seconds_bucket{{rpc="{rpc}",le="{}"}}"#,
                bound.as_secs_f64()
            );
            let n = samples[&key];
            assert!(n >= previous, "{key} is not cumulative");
            previous = n;
        }
        let inf = samples[&format!(r#"csi_rpc_duration_seconds_bucket{{rpc="{rpc}",le="+Inf"}}"#)];
        assert!(inf >= previous);
        assert_eq!(
            inf,
            samples[&format!(r#"csi_rpc_duration_seconds_count{{rpc="{rpc}"}}"#)]
        );
    }
    // Only the RPCs that ran, and only their outcomes.
    let totals = samples
        .keys()
        .filter(|k| k.starts_with("csi_rpc_total"))
        .count();
    assert_eq!(totals, 2);
}

/// A user layer: counts requests and notes its name in a shared log when called.
#[derive(Clone)]
struct Count<S> {
    inner: S,
    name: &'static str,
    requests: Arc<AtomicUsize>,
    order: Arc<Mutex<Vec<&'static str>>>,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Count<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.order.lock().unwrap().push(self.name);
        self.inner.call(req)
    }
}

fn count_layer(
    name: &'static str,
    requests: &Arc<AtomicUsize>,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> impl tower::Layer<csi_client::PluginChannel, Service = Count<csi_client::PluginChannel>>
+ Send
+ Sync
+ 'static {
    let (requests, order) = (requests.clone(), order.clone());
    tower::layer::layer_fn(move |inner| Count {
        inner,
        name,
        requests: requests.clone(),
        order: order.clone(),
    })
}

#[tokio::test]
async fn user_layers_see_every_attempt_the_last_added_first() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(1, Code::Unavailable, "busy")
        .install();
    let inner_count = Arc::new(AtomicUsize::new(0));
    let outer_count = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let client = builder(&mock)
        .layer(count_layer("inner", &inner_count, &order))
        .layer(count_layer("outer", &outer_count, &order))
        .build();

    guard(client.identity().probe()).await.unwrap();
    assert_eq!(inner_count.load(Ordering::Relaxed), 1);
    assert_eq!(*order.lock().unwrap(), ["outer", "inner"]);

    // Two attempts, two requests through each layer.
    guard(client.node().node_get_capabilities()).await.unwrap();
    assert_eq!(inner_count.load(Ordering::Relaxed), 3);
    assert_eq!(outer_count.load(Ordering::Relaxed), 3);
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 2);
}

async fn metadata_stream(
    client: &CsiClient,
) -> csi_client::MetadataStream<csi_client::proto::GetMetadataAllocatedResponse> {
    let volume = csi_structs::ExternalVolumeId::new("vol-1").unwrap();
    let snapshot = guard(client.controller().create_snapshot(
        &volume,
        "snap-1",
        &Default::default(),
        &Default::default(),
    ))
    .await
    .unwrap();
    guard(client.snapshot_metadata().get_metadata_allocated(
        csi_client::proto::GetMetadataAllocatedRequest {
            snapshot_id: snapshot.snapshot_id.as_str().to_owned(),
            starting_offset: 0,
            max_results: 1,
            ..Default::default()
        },
    ))
    .await
    .unwrap()
}

#[tokio::test]
async fn a_stream_is_recorded_when_it_ends() {
    let mock = Mock::default().await;
    let (client, metrics) = with_metrics(&mock);
    let mut stream = metadata_stream(&client).await;
    // Open, not finished: the status comes in the trailers after the last message.
    assert_eq!(metrics.requests(Rpc::GetMetadataAllocated), 0);
    let mut messages = 0;
    while guard(stream.message()).await.unwrap().is_some() {
        messages += 1;
    }
    assert!(messages > 1, "the mock sends several messages");
    assert_eq!(metrics.count(Rpc::GetMetadataAllocated, OK), 1);
    assert_eq!(metrics.requests(Rpc::GetMetadataAllocated), 1);
}

#[tokio::test]
async fn a_stream_dropped_before_its_end_is_recorded_as_dropped() {
    let mock = Mock::default().await;
    let (client, metrics) = with_metrics(&mock);
    let mut stream = metadata_stream(&client).await;
    assert!(guard(stream.message()).await.unwrap().is_some());
    assert_eq!(metrics.requests(Rpc::GetMetadataAllocated), 0);
    drop(stream);
    assert_eq!(
        metrics.count(Rpc::GetMetadataAllocated, RpcOutcome::Dropped),
        1
    );
    assert_eq!(metrics.requests(Rpc::GetMetadataAllocated), 1);
}
