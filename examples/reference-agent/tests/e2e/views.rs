//! The agent's answers, tables, metrics and logs, from values: no agent runs. Each checks what
//! an operator or a client reads: status codes and kinds, escaped plugin text, field names.

mod tables {
    use csi_agent::ops::api::{
        ClaimView, DutyView, PluginView, ReconcileView, ReconciledView, ReleaseView,
        ReleasedWhileGoneView, StatusView, VolumeView,
    };
    use csi_agent::ops::table::*;
    use csi_structs::untrusted::needs_escape;
    use std::collections::BTreeMap;

    /// Every line of `text` is a row of the table: nothing a plugin wrote starts a line or
    /// drives the terminal.
    fn lines_only(text: &str, rows: usize) {
        assert_eq!(text.lines().count(), rows, "{text}");
        assert!(
            !text.chars().any(|c| c != '\n' && needs_escape(c)),
            "{text:?}"
        );
    }

    fn plugin(version: &str, last_error: &str) -> PluginView {
        PluginView {
            id: "mock".into(),
            node: "n1".into(),
            socket: Some("/run/csi/mock.sock".into()),
            health: "healthy".into(),
            health_reason: None,
            name: Some("mock.csi.example".into()),
            version: Some(version.into()),
            controller: true,
            node_service: true,
            plugin_node: Some("node-1\r\u{0}".into()),
            controller_publish: true,
            staging: true,
            fingerprints: 1,
            last_error: Some(last_error.into()),
            in_use: 0,
            capabilities: vec!["expansion:OFFLINE".into(), "node:#99\nforged".into()],
            max_volumes: Some(16),
            topology: Some([("zone".into(), "a\nb".into())].into()),
        }
    }

    fn release(pending: &str, workload: Option<&str>, step: Option<&str>) -> ReleaseView {
        ReleaseView {
            volume: "v1".into(),
            pending: pending.into(),
            pending_workload: workload.map(Into::into),
            backoff_step: step.map(Into::into),
            attempts: 2,
            last_error: Some("plugin returned Unavailable".into()),
            last_error_class: Some("retry".into()),
            next_retry_ms: Some(1500),
            durable: true,
            claims: Vec::new(),
        }
    }

    #[test]
    fn a_release_backing_off_names_the_step_it_retries() {
        let list = releases(&[
            release("backoff", Some("w1"), Some("controller_detach")),
            release("backoff", None, Some("store_read")),
            release("node_detach", Some("w2"), None),
        ]);
        lines_only(&list, 4);
        let rows: Vec<&str> = list.lines().skip(1).collect();
        assert!(
            rows[0].contains("backoff: controller_detach (w1)") && rows[0].contains(" 1s "),
            "{list}"
        );
        assert!(rows[1].contains("backoff: store_read "), "{list}");
        assert!(
            rows[2].contains("node_detach (w2)") && !rows[2].contains("backoff"),
            "{list}"
        );
    }

    #[test]
    fn plugin_text_cannot_forge_a_row_of_plugin_list() {
        let forged = "1.0\nmock2  n1  healthy  yes  yes  -  1  0  9.9\u{1b}[2J";
        let list = plugins(&[plugin(forged, "boom\r\nforged")]);
        lines_only(&list, 2);
        assert!(list.contains(r"1.0\nmock2  n1"), "{list}");
        let detail = plugin_detail(&plugin(forged, "boom\r\nforged"));
        lines_only(&detail, 19);
        assert!(detail.contains(r"boom\r\nforged"), "{detail}");
        for row in [r"expansion:OFFLINE node:#99\nforged", r"{zone=a\nb}"] {
            assert!(detail.contains(row), "{row} missing from\n{detail}");
        }
        let limit = detail.lines().find(|l| l.starts_with("attach limit"));
        assert!(limit.is_some_and(|l| l.ends_with(" 16")), "{detail}");
    }

    #[test]
    fn a_held_duty_says_until_when_it_is_confirmed_or_that_it_is_not() {
        let mut duty = DutyView {
            holds: true,
            confirmed_for_ms: 2_400,
            revision: 17,
        };
        assert_eq!(
            held_duty(&duty),
            " (held here, revision 17: confirmed for 2.4s)"
        );
        duty.holds = false;
        duty.confirmed_for_ms = 0;
        let lapsed = held_duty(&duty);
        assert!(
            lapsed.contains("NOT confirmed") && lapsed.contains("revision 17"),
            "{lapsed}"
        );
    }

    #[test]
    fn status_shows_the_restored_records_and_their_errors_escaped() {
        let mut s = StatusView {
            node: "n1".into(),
            plugins: Vec::new(),
            peers: Vec::new(),
            volumes: 1,
            claims: BTreeMap::new(),
            stuck: Vec::new(),
            waiting: Vec::new(),
            uncertain: Vec::new(),
            cluster: None,
            store_failure: None,
            failing_files: Vec::new(),
            reconcile: None,
            abnormal: Vec::new(),
            ignored_plugin_files: Vec::new(),
        };
        assert!(status(&s).contains("RESTORED NODE RECORDS\nbeing confirmed"));
        s.reconcile = Some(ReconcileView::default());
        assert!(
            !status(&s).contains("RESTORED"),
            "nothing restored: no section"
        );
        s.reconcile = Some(ReconcileView {
            plugins_not_ready: vec!["gone".into()],
            records: vec![ReconciledView {
                plugin: "gone".into(),
                volume: "v1".into(),
                workload: "w1".into(),
                found: "stage done, publish done".into(),
                action: "plugin_missing".into(),
                error: Some("plugin gone has no node service\nforged  row".into()),
                class: Some("retry_elsewhere".into()),
            }],
            released_while_gone: Vec::new(),
        });
        let text = status(&s);
        let section = text
            .split("RESTORED NODE RECORDS")
            .nth(1)
            .expect("the section");
        // Its heading's rest, the plugins not ready, the table's header and one row.
        lines_only(section, 4);
        assert!(
            section.contains(r"no node service\nforged  row (class retry_elsewhere)"),
            "{section}"
        );
        assert!(section.contains("plugins not ready when the wait ended: gone"));
    }

    #[test]
    fn status_says_what_was_released_while_the_node_was_reported_gone() {
        let released = ReconciledView {
            plugin: "mock".into(),
            volume: "v1".into(),
            workload: "w1".into(),
            found: "stage done, publish done".into(),
            action: "released".into(),
            error: None,
            class: None,
        };
        let s = StatusView {
            node: "n1".into(),
            plugins: Vec::new(),
            peers: Vec::new(),
            volumes: 1,
            claims: BTreeMap::new(),
            stuck: Vec::new(),
            waiting: Vec::new(),
            uncertain: Vec::new(),
            cluster: None,
            store_failure: None,
            failing_files: Vec::new(),
            reconcile: Some(ReconcileView {
                plugins_not_ready: Vec::new(),
                records: vec![released],
                released_while_gone: vec![ReleasedWhileGoneView {
                    plugin: "mock".into(),
                    volume: "v1".into(),
                    workload: "w1\nforged  row".into(),
                    done: "unpublished and unstaged".into(),
                    claim: "controller_step_resumed".into(),
                }],
            }),
            abnormal: Vec::new(),
            ignored_plugin_files: Vec::new(),
        };
        let text = status(&s);
        let section = text
            .split("RELEASED WHILE THIS NODE WAS REPORTED GONE")
            .nth(1)
            .expect("the section");
        // Its heading's rest, the table's header and one row.
        lines_only(section, 3);
        assert!(
            section.contains("unpublished and unstaged")
                && section.contains("controller_step_resumed"),
            "{section}"
        );
        assert!(section.contains(r"w1\nforged  row"), "{section}");
    }

    #[test]
    fn plugin_text_cannot_forge_a_row_of_volume_status() {
        let claim = ClaimView {
            volume: "v1".into(),
            workload: "w1".into(),
            node: "n1".into(),
            plugin_node: "node-1".into(),
            mode: "write".into(),
            access_mode: "SINGLE_NODE_WRITER".into(),
            state: "releasing".into(),
            target_path: Some("/t/\u{1b}]0;title\u{7}".into()),
        };
        let volume = VolumeView {
            id: "v1".into(),
            external_id: "ext-1\nv2  mock  ext-2  SINGLE_NODE_WRITER  0  -".into(),
            plugin: "mock".into(),
            access_mode: "SINGLE_NODE_WRITER".into(),
            attachment: "mount".into(),
            controller_publish: true,
            created: true,
            secret_names: Vec::new(),
            capacity_bytes: None,
            accessible_topology: Vec::new(),
            node_expansion_pending: false,
            claims: vec![claim.clone()],
            release: Some(ReleaseView {
                volume: "v1".into(),
                pending: "node_unpublish".into(),
                pending_workload: Some("w1".into()),
                backoff_step: None,
                attempts: 2,
                last_error: Some("plugin returned Internal: disk\0gone\nforged".into()),
                last_error_class: Some("retry".into()),
                next_retry_ms: Some(500),
                durable: true,
                claims: vec![claim],
            }),
            calls_in_flight: Vec::new(),
            may_exist: None,
            health: None,
            waiting: Vec::new(),
        };
        lines_only(&volumes(std::slice::from_ref(&volume)), 2);
        // The detail: one line, the claims table (2), "release:", the release table (2).
        let detail = volume_detail(&volume);
        lines_only(&detail, 6);
        assert!(
            detail.contains(r"external id ext-1\nv2  mock")
                && detail.contains(r"disk\0gone\nforged"),
            "{detail}"
        );
    }
}

mod ops_flags {
    use std::collections::BTreeMap;

    use csi_agent::ops::table::Table;
    use csi_agent::ops::{pairs, parse_bytes, topologies};

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1Gi").ok(), Some(1 << 30));
        assert_eq!(parse_bytes("10G").ok(), Some(10_000_000_000));
        assert_eq!(parse_bytes("42").ok(), Some(42));
        for bad in ["", "G", "1X", "-1", "99999999999999Ti"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_value_pairs() {
        assert_eq!(
            pairs("context", &["a=b=c".into()]).ok(),
            Some(BTreeMap::from([("a".into(), "b=c".into())]))
        );
        assert!(pairs("context", &["nope".into()]).is_err());
    }

    #[test]
    fn topology_flags() {
        let got = topologies("topology", &["zone=a,region=r".into(), "zone=b".into()]).ok();
        assert_eq!(
            got,
            Some(vec![
                BTreeMap::from([("zone".into(), "a".into()), ("region".into(), "r".into())]),
                BTreeMap::from([("zone".into(), "b".into())]),
            ])
        );
        for bad in ["zone", "zone=a,zone=b", "zone=a,"] {
            let err = topologies("topology", &[bad.into()])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--topology"), "{bad}: {err}");
        }
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["xxxx".into(), "y".into()]);
        assert_eq!(t.render(), "A     LONGER\nxxxx  y\n");
    }
}

mod segments {
    use csi_agent::ops::api::{decode_segment, encode_segment};

    #[test]
    fn path_segments_round_trip() {
        for id in ["db", "a b/c?d#e%f", "ünï", "..", ""] {
            let enc = encode_segment(id);
            assert!(!enc.contains('/') && !enc.contains(' ') && !enc.contains('?'));
            assert_eq!(decode_segment(&enc).as_deref(), Some(id));
        }
        for broken in ["%", "%4", "%zz", "%ff"] {
            assert_eq!(decode_segment(broken), None, "{broken}");
        }
    }
}

mod answers {
    use std::sync::Arc;

    use csi_agent::ops::api;
    use csi_agent::serve::agent::{AgentError, parts, release_view};
    use csi_claims::driver::DriverError;
    use csi_claims::machine::ReleaseWait;
    use csi_claims::{ClaimMode, ReleaseStatus};
    use csi_node::state::StateFileError;
    use csi_node::volumes::VolumeError;
    use csi_rpc_shim::{AgentRpc, GrpcCode, PluginError, PluginFailure, ShimError};
    use csi_structs::{AccessMode, ErrorClass, NodeId, VolumeId, WorkloadId};
    use std::time::Duration;
    use tokio::time::Instant;

    fn through_shim(error: PluginError) -> AgentError {
        let e = ShimError::Plugin {
            rpc: AgentRpc::ControllerCreateVolume,
            node: NodeId::new("n1").unwrap(),
            error,
        };
        AgentError::shim("CreateVolume", &e)
    }

    fn status(pending: ReleaseWait, next_retry: Option<Instant>) -> ReleaseStatus {
        ReleaseStatus {
            volume: csi_structs::VolumeId::new("v1").unwrap(),
            claims: Vec::new(),
            pending,
            attempts: 1,
            last_error: None,
            next_retry,
            durable: true,
        }
    }

    #[test]
    fn a_release_backing_off_shows_the_step_and_stays_readable_by_older_clients() {
        use csi_claims::machine::RetriedStep;
        let until = Instant::now() + Duration::from_secs(60);
        let workload = csi_structs::WorkloadId::new("w1").unwrap();
        let node = release_view(&status(
            ReleaseWait::Backoff {
                step: RetriedStep::NodeDetach(workload.clone()),
                until,
            },
            Some(until),
        ));
        assert_eq!(node.pending, "backoff");
        assert_eq!(node.pending_workload.as_deref(), Some("w1"));
        assert_eq!(node.backoff_step.as_deref(), Some("node_detach"));
        assert!(node.next_retry_ms.is_some_and(|ms| ms > 50_000), "{node:?}");
        let store = release_view(&status(
            ReleaseWait::Backoff {
                step: RetriedStep::StoreRead,
                until,
            },
            Some(until),
        ));
        assert_eq!(
            (store.pending_workload, store.backoff_step.as_deref()),
            (None, Some("store_read"))
        );

        // Not backing off: no new field in the JSON, and older JSON without it still reads.
        let calling = release_view(&status(ReleaseWait::ControllerDetach(workload), None));
        assert_eq!(calling.pending, "controller_detach");
        let json = serde_json::to_value(&calling).unwrap();
        assert!(json.get("backoff_step").is_none(), "{json}");
        let older: api::ReleaseView = serde_json::from_value(json).unwrap();
        assert_eq!(older.backoff_step, None);
        let idle = release_view(&status(ReleaseWait::Nothing, None));
        assert_eq!(
            (idle.pending.as_str(), idle.backoff_step),
            ("nothing", None)
        );
    }

    #[test]
    fn the_kind_says_who_said_what() {
        let answered = through_shim(PluginError::new(
            ErrorClass::Fatal,
            GrpcCode::InvalidArgument,
            "CreateVolume: plugin returned InvalidArgument: bad size",
        ));
        assert_eq!(parts(&answered), (502, "plugin", Some(ErrorClass::Fatal)));

        // The plugin answered OK and we refused its answer: not the plugin's status, and
        // the volume may exist.
        let refused = through_shim(PluginError::failed(
            ErrorClass::Uncertain,
            PluginFailure::UnusableAnswer,
            "CreateVolume: the plugin's answer was unusable: a message of 5000000 bytes is over \
             the 4194304-byte decode limit",
        ));
        assert_eq!(
            parts(&refused),
            (502, "plugin_answer", Some(ErrorClass::Uncertain))
        );
        let text = refused.to_string();
        assert!(
            text.contains("plugin's answer was unusable (uncertain)"),
            "{text}"
        );
        assert!(!text.contains("plugin answered"), "{text}");

        // Our deadline is not the plugin's DEADLINE_EXCEEDED.
        let late = through_shim(PluginError::failed(
            ErrorClass::Uncertain,
            PluginFailure::Deadline,
            "the caller's deadline passed before the plugin answered",
        ));
        assert_eq!(parts(&late).1, "deadline");
        assert!(!late.to_string().contains("DeadlineExceeded"), "{late}");
        let shim_late = AgentError::shim(
            "CreateVolume",
            &ShimError::DeadlineExceeded {
                rpc: AgentRpc::ControllerCreateVolume,
                node: None,
            },
        );
        assert_eq!(parts(&shim_late).1, "deadline");
    }

    fn vid(s: &str) -> VolumeId {
        VolumeId::new(s).expect("id")
    }

    #[test]
    fn our_own_failures_are_503_with_their_own_kind_never_plugin() {
        let reason = "claim store redb /data/claims.redb failed to commit: I/O error: \
                      No space left on device (os error 28)";
        let not_stored = AgentError::Claims(DriverError::NotStored {
            what: "claim",
            volume: vid("v"),
            workload: WorkloadId::new("w").expect("id"),
            reason: reason.to_owned(),
        });
        let waiting = AgentError::Claims(DriverError::Claim(
            csi_claims::ClaimError::StoreUnavailable {
                volume: vid("v"),
                reason: reason.to_owned(),
            },
        ));
        for e in [&not_stored, &waiting] {
            assert_eq!(parts(e), (503, "store", Some(ErrorClass::Retry)), "{e}");
            assert!(e.to_string().contains("/data/claims.redb"), "{e}");
        }
        let state = AgentError::State(StateFileError::Io {
            path: "/data/volumes.json".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let dir = AgentError::node(
            "mount",
            &VolumeError::Dir {
                volume: vid("v"),
                action: "create",
                path: "/data/node/staging/v".into(),
                source: Arc::new(std::io::Error::from_raw_os_error(28)),
            },
        );
        for e in [&state, &dir] {
            assert_eq!(parts(e), (503, "local_io", Some(ErrorClass::Retry)), "{e}");
            assert!(!e.to_string().contains("plugin"), "{e}");
        }
        // The usage records in the node's database: a store failure, as the claims' are.
        let usage = AgentError::node(
            "mount",
            &VolumeError::Usage {
                volume: vid("v"),
                source: Arc::new(StateFileError::Store {
                    path: "/data/claims.redb".into(),
                    detail: "claim store redb /data/claims.redb failed to commit".into(),
                }),
            },
        );
        assert_eq!(
            parts(&usage),
            (503, "store", Some(ErrorClass::Retry)),
            "{usage}"
        );
        assert!(usage.to_string().contains("/data/claims.redb"), "{usage}");
        // A refused claim is still the caller's business, not a failure of ours.
        let denied = AgentError::Claims(DriverError::Claim(csi_claims::ClaimError::Reloading {
            volume: vid("v"),
        }));
        assert_eq!(parts(&denied).1, "claim");
    }

    #[test]
    fn a_denied_claim_is_answered_409_claim_without_a_class_as_before() {
        let denied = csi_claims::ClaimDenied {
            volume: vid("v"),
            workload: WorkloadId::new("w2").expect("id"),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            reason: csi_claims::DenyReason::SingleWorkload,
            holders: csi_claims::accounting::Holders(vec![csi_claims::accounting::Holder {
                workload: WorkloadId::new("w1").expect("id"),
                node: NodeId::new("n1").expect("id"),
                mode: ClaimMode::Write,
                state: "taken",
            }]),
        };
        let from_driver =
            DriverError::Claim(csi_claims::ClaimError::Denied(Box::new(denied.clone())));
        let text = from_driver.to_string();
        let e = AgentError::from(from_driver);
        assert!(
            matches!(&e, AgentError::Denied(d) if *d.as_ref() == denied),
            "{e:?}"
        );
        assert_eq!(parts(&e), (409, "claim", None));
        assert_eq!(e.to_string(), text);
    }
}

mod bodies {
    use csi_agent::ops::api;
    use csi_agent::serve::http::{Access, bounded, parse_body};

    /// Found by campaign `api`: serde_json says where a value of the wrong type is, not which
    /// field it is; and a misspelt field was ignored.
    #[test]
    fn a_bad_body_is_refused_naming_the_field() {
        let wrong = parse_body::<api::CreateVolume>(
            br#"{"id":"v","plugin":"p","capacity_bytes":"12","access_mode":"x","attachment":"mount"}"#,
        )
        .expect_err("a string where a number goes");
        assert!(wrong.contains("`capacity_bytes`"), "{wrong}");
        let nested = parse_body::<api::RegisterVolume>(
            br#"{"id":"v","external_id":"e","plugin":"p","access_mode":"x","attachment":"mount","controller_publish":null,"context":{"a":1}}"#,
        )
        .expect_err("a number in a map of strings");
        assert!(nested.contains("`context.a`"), "{nested}");
        let unknown = parse_body::<api::ExpandVolume>(br#"{"capacity_bytes":1,"force_":true}"#)
            .expect_err("a misspelt field");
        assert!(unknown.contains("`force_`"), "{unknown}");
        let missing =
            parse_body::<api::ClaimVolume>(br#"{"mode":"read"}"#).expect_err("a missing field");
        assert!(missing.contains("`workload`"), "{missing}");
        let broken = parse_body::<api::ClaimVolume>(br#"{"workload":"w","mode":"read"} x"#)
            .expect_err("trailing bytes");
        assert!(broken.starts_with("invalid JSON body: "), "{broken}");
        let ok: api::ClaimVolume =
            parse_body(br#"{"workload":"w","mode":"read"}"#).expect("a good body");
        assert_eq!(ok.workload, "w");
    }

    /// Found by campaign `api` (seed 10): `GET /v1/plugins/<2,114 bytes>` quoted the whole id.
    #[test]
    fn an_error_message_is_cut_to_the_limit_saying_how_long_it_was() {
        let short = "no plugin \"p\"".to_owned();
        assert_eq!(bounded(short.clone()), short);
        let exact = "x".repeat(api::MAX_ERROR_BYTES);
        assert_eq!(bounded(exact.clone()), exact);

        for filler in ["v", "é", "🦀"] {
            let long = format!("no plugin {:?}", filler.repeat(3000));
            let total = long.len();
            let cut = bounded(long.clone());
            assert!(cut.len() <= api::MAX_ERROR_BYTES, "{} bytes", cut.len());
            assert!(cut.ends_with(&format!("({total} bytes in all)")), "{cut}");
            let kept = cut.split("… (").next().expect("a prefix");
            assert!(long.starts_with(kept), "a prefix of the message is kept");
            assert!(
                kept.len() > api::MAX_ERROR_BYTES - 40,
                "{} bytes kept",
                kept.len()
            );
        }
    }

    #[test]
    fn access_debug_prints_no_token() {
        let access = Access {
            control_token: "control-secret-value".into(),
            cluster_token: Some("cluster-secret-value".into()),
        };
        let shown = format!("{access:?}");
        assert!(!shown.contains("secret-value"), "{shown}");
        assert!(shown.contains("redacted"));
    }
}

mod log {
    use csi_agent::serve::log::escaped_fields;
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plugin_text_cannot_forge_a_log_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let volume = "vol-1\n2026-01-01T00:00:00Z  INFO forged: volume deleted";
        let version = "1.0\r\u{1b}[2J";
        let error = "boom\0\nERROR forged";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(volume = %volume, version = %version, "created {}", error);
            tracing::warn!(error = %error, "plugin failed");
        });
        let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(
            !log.chars()
                .any(|c| c != '\n' && csi_structs::untrusted::needs_escape(c)),
            "{log:?}"
        );
        assert!(
            log.contains(r"created boom\0\nERROR forged")
                && log.contains(r"volume=vol-1\n2026-01-01T00:00:00Z  INFO forged")
                && log.contains(r"version=1.0\r\u{1b}[2J"),
            "{log}"
        );
    }
}

#[cfg(feature = "etcd")]
mod member_record {
    use csi_agent::ops::api;
    use csi_agent::serve::cluster::HTTP_FIELD;
    use csi_control::peers::NodeAbout;
    use serde::{Deserialize, Serialize};

    /// The record as agents wrote it before membership moved to csi-control, field for field.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct OldMemberRecord {
        format: u32,
        node: String,
        instance: String,
        http: String,
        shim: String,
        plugins: Vec<api::PeerPlugin>,
    }

    fn plugins() -> Vec<api::PeerPlugin> {
        // Known and unknown capabilities: sets, enums and numbers inside the flattened part.
        let mut capabilities = csi_structs::Capabilities::default();
        capabilities.plugin.insert_service_wire(1);
        capabilities.controller.insert_wire(1);
        capabilities.controller.insert_wire(999);
        capabilities.node.insert_wire(1);
        vec![
            api::PeerPlugin {
                id: "ebs".into(),
                controller: Some(true),
                node: Some(("i-0a".into(), true)),
                controller_publish: true,
                capabilities: Some(capabilities),
            },
            api::PeerPlugin {
                id: "nfs".into(),
                controller: None,
                node: Some(("n-1".into(), false)),
                controller_publish: false,
                capabilities: None,
            },
        ]
    }

    /// The record the front door writes for an agent: the JSON agents wrote before, the same
    /// fields with the same values (in another order), and each side reads the other's.
    #[test]
    fn an_agents_record_is_the_json_agents_wrote_before_and_reads_theirs() {
        let mut extra = serde_json::Map::new();
        extra.insert(HTTP_FIELD.into(), "127.0.0.1:8080".into());
        let new = csi_control::MemberRecord::new(
            "n1",
            "3f2a9c",
            NodeAbout {
                shim: "10.0.0.1:9000".into(),
                plugins: plugins(),
                extra,
            },
        );
        let old = OldMemberRecord {
            format: 1,
            node: "n1".into(),
            instance: "3f2a9c".into(),
            http: "127.0.0.1:8080".into(),
            shim: "10.0.0.1:9000".into(),
            plugins: plugins(),
        };
        let written = serde_json::to_value(&new).expect("encodes");
        assert_eq!(written, serde_json::to_value(&old).expect("encodes"));
        // Each side reads the other's.
        let read_old: OldMemberRecord = serde_json::from_value(written).expect("old reads new");
        assert_eq!(read_old, old);
        let old_written = serde_json::to_vec(&old).expect("encodes");
        let read_new: csi_control::MemberRecord<NodeAbout> =
            serde_json::from_slice(&old_written).expect("new reads old");
        assert_eq!(read_new, new);
    }
}

mod metrics {
    use csi_agent::metrics::{Gauges, Metrics};
    use csi_structs::PluginId;

    #[test]
    fn the_plugins_calls_and_the_gauges_render_together() {
        let m = Metrics::new();
        let endpoint = "unix:///run/none.sock".parse().expect("valid endpoint");
        let plugin = PluginId::new("mock").expect("valid id");
        let _client = m
            .instrument(&plugin, csi_client::CsiClient::builder(endpoint))
            .build();
        let mut g = Gauges::default();
        g.claims.insert("taken".into(), 2);
        g.stuck_releases = 1;
        g.plugins.insert("healthy".into(), 1);
        let text = m.render(&g);
        for want in [
            "# TYPE csi_agent_rpc_unsent_total counter",
            r#"csi_agent_claims{state="taken"} 2"#,
            "csi_agent_stuck_releases 1",
            r#"csi_agent_plugins{health="healthy"} 1"#,
            "csi_agent_store_failing 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }

    #[test]
    fn cluster_mode_has_its_gauges() {
        use csi_agent::ops::api::{ClusterView, DutyView, MemberView};
        let member = |node: &str, me| MemberView {
            node: node.into(),
            me,
            http: String::new(),
            shim: String::new(),
            plugins: Vec::new(),
        };
        let mut g = Gauges {
            cluster: Some(ClusterView {
                store: "etcd://127.0.0.1:2379".into(),
                prefix: "/csi-agent".into(),
                controller_duty: Some("a\"b".into()),
                held_duty: Some(DutyView {
                    holds: true,
                    confirmed_for_ms: 2_500,
                    revision: 7,
                }),
                members: vec![member("a\"b", true), member("c", false)],
                outage: None,
            }),
            ..Gauges::default()
        };
        let text = Metrics::new().render(&g);
        for want in [
            "csi_agent_cluster_members 2",
            r#"csi_agent_controller_duty_holder{node="a\"b"} 1"#,
            "csi_agent_controller_duty_held 1",
            "csi_agent_controller_duty_confirmed_seconds 2.5",
            "csi_agent_cluster_outage 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        // Nobody holds the duty, etcd is out: no holder series, and the outage says so.
        let c = g.cluster.as_mut().expect("cluster");
        (c.controller_duty, c.held_duty) = (None, None);
        c.outage = Some("etcd unreachable".into());
        let text = Metrics::new().render(&g);
        assert!(
            !text.contains("csi_agent_controller_duty_holder{"),
            "{text}"
        );
        for want in [
            "csi_agent_controller_duty_held 0",
            "csi_agent_cluster_outage 1",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        // The embedded store: no cluster gauges at all.
        let text = Metrics::new().render(&Gauges::default());
        assert!(!text.contains("csi_agent_cluster"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut g = Gauges::default();
        g.claims.insert("a\"b\\c\nd".into(), 1);
        let text = Metrics::new().render(&g);
        assert!(
            text.contains(r#"csi_agent_claims{state="a\"b\\c\nd"} 1"#),
            "{text}"
        );
    }
}
