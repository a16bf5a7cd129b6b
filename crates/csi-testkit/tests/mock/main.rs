//! Integration tests of the mock plugin over a real unix socket, with the generated tonic
//! clients. One test binary (link time is precious); one module per concern.

mod binary;
mod check_order;
mod condition;
mod controller;
mod errors;
mod faults;
mod lifecycle;
mod nodes;
mod persistence;
mod secrets;
mod streaming;
mod support;
mod transport;
