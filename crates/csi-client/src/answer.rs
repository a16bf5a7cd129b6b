//! What the link saw of one attempt's answer, and telling the plugin's status apart from an
//! answer we could not use.
//!
//! tonic reports both the same way: a status the plugin sent, and a failure of tonic's own
//! to read the answer (a message over the decode limit, bytes that are not a gRPC message,
//! an HTTP error page from something that is not a gRPC server), arrive as a
//! `tonic::Status` with a code and no source. Taking the second for the first blames the
//! plugin for our refusal and gives the wrong class: an answer over the limit would read
//! "plugin returned OutOfRange" and be fatal, although the plugin may have done the work.
//!
//! So the link records, per attempt and before tonic reads them, the HTTP status, the
//! `grpc-status` the plugin sent (in the headers or the trailers) and the length prefix of
//! every message. A status is the plugin's only when the plugin sent that very code;
//! anything else is an [unusable answer](ResponseError).
//!
//! The link also removes `grpc-status-details-bin` from the answer: this crate never reads
//! status details, and tonic panics on a value that is not valid base64.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::Code;

use crate::error::{ErrorKind, MAX_ANSWER_BYTES, ResponseError};

/// The header a gRPC server puts its status in.
const GRPC_STATUS: &str = "grpc-status";
/// Status details, which this crate never reads (see the module docs).
const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";
/// Bytes before each gRPC message: a compression flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// The `grpc-status` value the plugin sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SentStatus {
    /// A decimal number (known code or not).
    Number(u32),
    /// Something that is not a decimal number.
    Garbled,
}

#[derive(Debug, Default)]
struct Seen {
    http_status: Option<u16>,
    grpc_status: Option<SentStatus>,
    /// The largest length prefix of a message in the answer.
    largest_message: Option<u64>,
    /// How many message prefixes the answer held.
    messages: u64,
}

/// One attempt's record of its answer, shared between the attempt loop and the link through
/// the request's extensions. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct AnswerWatch(Arc<Mutex<Seen>>);

impl AnswerWatch {
    /// A record of an answer not received yet.
    pub(crate) fn new() -> AnswerWatch {
        AnswerWatch::default()
    }

    /// A record of an HTTP 200 answer whose `grpc-status` was `number`.
    #[cfg(test)]
    pub(crate) fn sent_status(number: u32) -> AnswerWatch {
        let watch = AnswerWatch::new();
        watch.update(|seen| {
            seen.http_status = Some(200);
            seen.grpc_status = Some(SentStatus::Number(number));
        });
        watch
    }

    fn update(&self, change: impl FnOnce(&mut Seen)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Notes the `grpc-status` in `headers` (response headers or trailers) and removes the
    /// status details.
    fn headers(&self, headers: &mut HeaderMap) {
        headers.remove(GRPC_STATUS_DETAILS);
        if let Some(value) = headers.get(GRPC_STATUS) {
            let sent = std::str::from_utf8(value.as_bytes())
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u32>().ok())
                .map_or(SentStatus::Garbled, SentStatus::Number);
            self.update(|seen| seen.grpc_status = Some(sent));
        }
    }

    /// Wraps `response` so its status, headers, messages and trailers are recorded as they
    /// pass to tonic.
    pub(crate) fn watch<B>(
        &self,
        mut response: http::Response<B>,
    ) -> http::Response<tonic::body::Body>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: Into<tower::BoxError>,
    {
        let status = response.status().as_u16();
        self.update(|seen| seen.http_status = Some(status));
        self.headers(response.headers_mut());
        let watch = self.clone();
        response.map(|inner| tonic::body::Body::new(Watched::new(inner, watch)))
    }

    /// Whether the answer's headers arrived (the link saw an HTTP status).
    pub(crate) fn headers_arrived(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .http_status
            .is_some()
    }

    /// The answer of a unary call that tonic read as success, when it held more than one
    /// message: tonic takes the first and drops the others, but such an answer contradicts
    /// itself (which message is the plugin's?), so it is unusable. Call once the whole answer
    /// was read (tonic reads a unary answer to its trailers before returning it).
    pub(crate) fn extra_messages(&self) -> Option<ErrorKind> {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (seen.messages > 1).then(|| {
            ErrorKind::InvalidResponse(ResponseError::Undecodable {
                detail: format!(
                    "the answer of a unary call holds {} messages, not one",
                    seen.messages
                ),
            })
        })
    }

    /// What a status without a transport source (one the plugin sent, or tonic's own
    /// failure to read the answer) really was.
    pub(crate) fn kind_of(&self, status: &tonic::Status) -> ErrorKind {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let code = status.code();
        match seen.grpc_status {
            Some(SentStatus::Number(n)) if n != 0 && n == code as u32 => {
                return ErrorKind::Status {
                    code,
                    message: status.message().to_owned(),
                };
            }
            // tonic reads any number it does not know as UNKNOWN.
            Some(SentStatus::Number(n)) if n > 16 && code == Code::Unknown => {
                return ErrorKind::UnknownStatus {
                    number: n,
                    message: status.message().to_owned(),
                };
            }
            _ => {}
        }
        let unusable = match (seen.largest_message, seen.http_status) {
            (Some(size), _) if size > MAX_ANSWER_BYTES as u64 => ResponseError::TooLarge {
                size,
                limit: MAX_ANSWER_BYTES,
            },
            (_, Some(http_status)) if http_status != 200 => ResponseError::NotGrpc { http_status },
            _ if seen.grpc_status == Some(SentStatus::Garbled) => ResponseError::Undecodable {
                detail: "its grpc-status is not a decimal number".into(),
            },
            // tonic's own words: what it could not read.
            _ => ResponseError::Undecodable {
                detail: status.message().to_owned(),
            },
        };
        ErrorKind::InvalidResponse(unusable)
    }
}

/// A response body that records what passes through it.
struct Watched<B> {
    inner: B,
    watch: AnswerWatch,
    /// The part of a message's length prefix received so far.
    prefix: [u8; PREFIX_BYTES],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    skip: u64,
    /// A prefix had a compression flag other than 0 or 1: these bytes are not gRPC
    /// messages, and their lengths mean nothing.
    lost: bool,
}

impl<B> Watched<B> {
    fn new(inner: B, watch: AnswerWatch) -> Self {
        Watched {
            inner,
            watch,
            prefix: [0; PREFIX_BYTES],
            prefix_len: 0,
            skip: 0,
            lost: false,
        }
    }

    /// Follows the message framing through `data`, recording each length prefix.
    fn data(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.lost {
            if self.skip > 0 {
                let n = data
                    .len()
                    .min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = data.len().min(PREFIX_BYTES - self.prefix_len);
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len == PREFIX_BYTES {
                let [flag, a, b, c, d] = self.prefix;
                if flag > 1 {
                    self.lost = true;
                    return;
                }
                let length = u64::from(u32::from_be_bytes([a, b, c, d]));
                self.watch.update(|seen| {
                    seen.largest_message = Some(seen.largest_message.unwrap_or(0).max(length));
                    seen.messages += 1;
                });
                self.skip = length;
                self.prefix_len = 0;
            }
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Watched<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let mut polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            if let Some(data) = frame.data_ref() {
                this.data(data);
            } else if let Some(trailers) = frame.trailers_mut() {
                this.watch.headers(trailers);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(
        http_status: u16,
        grpc_status: Option<SentStatus>,
        largest: Option<u64>,
    ) -> AnswerWatch {
        let watch = AnswerWatch::new();
        watch.update(|s| {
            s.http_status = Some(http_status);
            s.grpc_status = grpc_status;
            s.largest_message = largest;
        });
        watch
    }

    #[test]
    fn a_status_is_the_plugins_only_when_it_sent_that_code() {
        let sent = seen(200, Some(SentStatus::Number(5)), None);
        let kind = sent.kind_of(&tonic::Status::not_found("gone"));
        assert!(
            matches!(kind, ErrorKind::Status { code: Code::NotFound, ref message } if message == "gone"),
            "{kind:?}"
        );
        let unknown = seen(200, Some(SentStatus::Number(99)), None);
        let kind = unknown.kind_of(&tonic::Status::unknown("boom"));
        assert!(
            matches!(kind, ErrorKind::UnknownStatus { number: 99, ref message } if message == "boom"),
            "{kind:?}"
        );
        // The plugin said OK; tonic's complaint is about the answer.
        let ok = seen(200, Some(SentStatus::Number(0)), None);
        let kind = ok.kind_of(&tonic::Status::internal("Missing response message."));
        assert!(
            matches!(
                kind,
                ErrorKind::InvalidResponse(ResponseError::Undecodable { .. })
            ),
            "{kind:?}"
        );
    }

    #[test]
    fn an_answer_we_refused_is_never_the_plugins_status() {
        let big = seen(200, None, Some(MAX_ANSWER_BYTES as u64 + 1));
        let kind = big.kind_of(&tonic::Status::out_of_range("too large"));
        assert!(
            matches!(
                kind,
                ErrorKind::InvalidResponse(ResponseError::TooLarge { size, limit })
                    if size == MAX_ANSWER_BYTES as u64 + 1 && limit == MAX_ANSWER_BYTES
            ),
            "{kind:?}"
        );
        let page = seen(500, None, Some(105));
        let kind = page.kind_of(&tonic::Status::internal("invalid compression flag: 105"));
        assert!(
            matches!(
                kind,
                ErrorKind::InvalidResponse(ResponseError::NotGrpc { http_status: 500 })
            ),
            "{kind:?}"
        );
        let garbled = seen(200, Some(SentStatus::Garbled), None);
        let kind = garbled.kind_of(&tonic::Status::unknown(""));
        assert!(
            matches!(kind, ErrorKind::InvalidResponse(ResponseError::Undecodable { ref detail }) if detail.contains("grpc-status")),
            "{kind:?}"
        );
    }

    #[test]
    fn message_prefixes_are_followed_across_frames() {
        let watch = AnswerWatch::new();
        let mut body = Watched::new((), watch.clone());
        // A 3-byte message split across frames, then a prefix announcing 70000 bytes split
        // inside the prefix itself.
        body.data(&[0, 0, 0]);
        body.data(&[0, 3, b'a']);
        body.data(&[b'b', b'c', 0, 0]);
        assert_eq!(watch.0.lock().unwrap().largest_message, Some(3));
        assert!(watch.extra_messages().is_none(), "one message so far");
        body.data(&[1, 0x11, 0x70]);
        assert_eq!(watch.0.lock().unwrap().largest_message, Some(70_000));
        assert_eq!(body.skip, 70_000);
        assert!(
            matches!(
                watch.extra_messages(),
                Some(ErrorKind::InvalidResponse(ResponseError::Undecodable { ref detail }))
                    if detail.contains("2 messages")
            ),
            "a second message"
        );

        // Text is not framing: its first byte is no compression flag, and nothing after it
        // reads as a length.
        let watch = AnswerWatch::new();
        let mut page = Watched::new((), watch.clone());
        page.data(b"internal server error");
        assert_eq!(watch.0.lock().unwrap().largest_message, None);
        assert!(page.lost);
    }
}
