//! Integration tests: several agents in one process over loopback TCP, fake plugins behind
//! `LocalPlugins`. No timing assertions: timeouts below are hang guards or deadlines whose
//! *kind* of failure is checked.

mod auth;
mod deadline;
mod every_call;
mod failover;
mod forwarding;
mod hostile;
mod node_calls;
mod support;
#[cfg(feature = "tls")]
mod tls;
mod validation;
