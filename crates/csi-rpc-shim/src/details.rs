//! Reading another agent's answers without letting them panic this one.
//!
//! tonic's client (0.14) decodes a `grpc-status-details-bin` header or trailer with an
//! `expect`: a value that is not base64 panics the task awaiting the call (a local caller's,
//! or a relaying agent's connection task). Another agent's answer is input like any other,
//! so the shim's channel goes through [`Checked`], which removes such a value before tonic
//! reads it. The status then arrives without details and is classified like any answer
//! outside the protocol ([`ProtocolProblem::MissingDetail`](crate::ProtocolProblem)).

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http_body_util::BodyExt as _;
use http_body_util::combinators::MapFrame;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Bytes, Context, Poll, Service};
use tonic::transport::Channel;

/// The header (or trailer) holding a status's encoded details.
const DETAILS: &str = "grpc-status-details-bin";

/// How tonic decodes [`DETAILS`]: standard alphabet, padding optional.
const TONIC_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Removes [`DETAILS`] from `headers` when any of its values would not decode.
pub(crate) fn keep_decodable_details(headers: &mut http::HeaderMap) {
    let undecodable = headers
        .get_all(DETAILS)
        .iter()
        .any(|v| TONIC_BASE64.decode(v.as_bytes()).is_err());
    if undecodable {
        headers.remove(DETAILS);
    }
}

type FrameCheck = fn(http_body::Frame<Bytes>) -> http_body::Frame<Bytes>;

fn check_trailers(mut frame: http_body::Frame<Bytes>) -> http_body::Frame<Bytes> {
    if let Some(trailers) = frame.trailers_mut() {
        keep_decodable_details(trailers);
    }
    frame
}

/// A [`Channel`] whose answers carry no details tonic cannot decode, in their headers or
/// their trailers.
#[derive(Clone, Debug)]
pub(crate) struct Checked(pub(crate) Channel);

impl Service<http::Request<Body>> for Checked {
    type Response = http::Response<MapFrame<Body, FrameCheck>>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answer = self.0.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            keep_decodable_details(response.headers_mut());
            Ok(response.map(|body| body.map_frame(check_trailers as FrameCheck)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_headers(details: &'static str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        h.insert(DETAILS, http::HeaderValue::from_static(details));
        h
    }

    /// The defect this module works around, found by the `shim` campaign (csi-campaigns): when
    /// tonic stops panicking here, this test fails and the workaround can go.
    #[test]
    fn tonic_panics_on_details_that_are_not_base64() {
        let h = status_headers("!!not base64!!");
        let read = std::panic::catch_unwind(|| tonic::Status::from_header_map(&h));
        assert!(read.is_err(), "tonic no longer panics: remove `Checked`");
    }

    #[test]
    fn undecodable_details_are_removed_and_the_status_reads() {
        let mut h = status_headers("!!not base64!!");
        keep_decodable_details(&mut h);
        assert!(h.get(DETAILS).is_none());
        let status = tonic::Status::from_header_map(&h).expect("a status");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.details().is_empty());
    }

    #[test]
    fn decodable_details_are_kept_padded_or_not() {
        for details in ["CAIQAQ==", "CAIQAQ", ""] {
            let mut h = status_headers(details);
            keep_decodable_details(&mut h);
            assert_eq!(
                h.get(DETAILS).map(|v| v.as_bytes()),
                Some(details.as_bytes())
            );
            let status = tonic::Status::from_header_map(&h).expect("a status");
            assert_eq!(
                status.details().len(),
                if details.is_empty() { 0 } else { 4 }
            );
        }
    }
}
