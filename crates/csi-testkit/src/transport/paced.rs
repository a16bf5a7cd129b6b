//! Reading a connection a few requests at a time.
//!
//! An HTTP/2 server reads every frame the socket holds before it answers any. Under 32 callers
//! one read can hold 32 requests: all are accepted, all answered, and the answers written back
//! in one piece, one turn of the connection's task later. Meanwhile the client has nothing to
//! do, and once it has the answers the server has nothing to do: the two processes take turns
//! instead of working at the same time.
//!
//! [`PacedIo`] hands the server the bytes of at most [`REQUESTS_PER_TURN`] complete requests
//! at a time. Then its reads stay `Pending` until the tasks queued so far (the calls those
//! requests started) have run, so the connection task writes their answers while the client
//! is still sending the rest. Bytes read past the limit are kept for the next turn; nothing is
//! dropped or reordered. A request is complete at the end of a DATA or HEADERS frame that
//! carries END_STREAM; the frames are only counted, never parsed further.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Complete requests handed to the server per turn. Of 1, 2, 4, 8, 12 and 16, 4 and 8 served
/// grpc-go's client best at 32 callers (about a fifth more Probes per second than no limit),
/// and 8 was the one of them that did not slow csi-client down.
pub(crate) const REQUESTS_PER_TURN: usize = 8;

/// The client connection preface, which comes before the first frame.
const PREFACE_LEN: usize = 24;

/// An HTTP/2 frame header's length.
const FRAME_HEADER_LEN: usize = 9;

/// The frame types that can end a stream.
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;

/// The END_STREAM flag of DATA and HEADERS frames.
const END_STREAM: u8 = 0x1;

/// Where the bytes handed over so far stand in the client's frame sequence.
#[derive(Debug)]
struct Frames {
    /// Bytes left of the preface or of the current frame's payload.
    skip: usize,
    /// The next frame's header, as far as it has arrived.
    header: [u8; FRAME_HEADER_LEN],
    /// Bytes of `header` arrived so far.
    have: usize,
    /// The current frame ends a stream: a request is complete with its last byte.
    ends_stream: bool,
}

impl Frames {
    fn new() -> Self {
        Frames {
            skip: PREFACE_LEN,
            header: [0; FRAME_HEADER_LEN],
            have: 0,
            ends_stream: false,
        }
    }

    /// Follows `bytes` until the end of the `limit`-th request completed in them. Returns how
    /// many bytes that is (all of them when fewer requests complete) and how many requests
    /// completed.
    fn advance(&mut self, bytes: &[u8], limit: usize) -> (usize, usize) {
        let mut at = 0;
        let mut completed = 0;
        while at < bytes.len() && completed < limit {
            if self.skip > 0 {
                let step = self.skip.min(bytes.len() - at);
                self.skip -= step;
                at += step;
            } else {
                self.header[self.have] = bytes[at];
                self.have += 1;
                at += 1;
                if self.have < FRAME_HEADER_LEN {
                    continue;
                }
                self.have = 0;
                let [a, b, c, kind, flags, ..] = self.header;
                self.skip = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                self.ends_stream = matches!(kind, DATA | HEADERS) && flags & END_STREAM != 0;
            }
            if self.skip == 0 && self.ends_stream {
                self.ends_stream = false;
                completed += 1;
            }
        }
        (at, completed)
    }
}

/// A server's side of a connection that hands over at most [`REQUESTS_PER_TURN`] requests
/// per turn (see the module docs). Writes pass straight through.
#[derive(Debug)]
pub(crate) struct PacedIo<T> {
    inner: T,
    /// Bytes read from `inner` but held back for a later turn.
    held: Vec<u8>,
    /// How much of `held` was handed over.
    held_from: usize,
    frames: Frames,
    /// Requests completed in this turn.
    handed: usize,
    /// Set when a turn ends; cleared by a task queued behind the ones the turn started.
    waiting: Arc<AtomicBool>,
}

impl<T> PacedIo<T> {
    pub(crate) fn new(inner: T) -> Self {
        PacedIo {
            inner,
            held: Vec::new(),
            held_from: 0,
            frames: Frames::new(),
            handed: 0,
            waiting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Ends the turn: reads stay `Pending` until the tasks queued so far have run.
    fn end_turn(&mut self, cx: &Context<'_>) {
        self.handed = 0;
        self.waiting.store(true, Ordering::Release);
        let waiting = Arc::clone(&self.waiting);
        let waker = cx.waker().clone();
        tokio::spawn(async move {
            waiting.store(false, Ordering::Release);
            waker.wake();
        });
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PacedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.waiting.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        if this.handed >= REQUESTS_PER_TURN {
            this.end_turn(cx);
            return Poll::Pending;
        }
        let limit = REQUESTS_PER_TURN - this.handed;
        if this.held_from < this.held.len() {
            let held = &this.held[this.held_from..];
            let room = held.len().min(buf.remaining());
            let (n, completed) = this.frames.advance(&held[..room], limit);
            buf.put_slice(&held[..n]);
            this.held_from += n;
            this.handed += completed;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            Poll::Pending => {
                // The socket is drained: the next bytes start a new turn.
                this.handed = 0;
                return Poll::Pending;
            }
            ready => return ready,
        }
        let read = &buf.filled()[before..];
        let (n, completed) = this.frames.advance(read, limit);
        this.handed += completed;
        if n < read.len() {
            this.held.clear();
            this.held.extend_from_slice(&read[n..]);
            this.held_from = 0;
            buf.set_filled(before + n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for PacedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    /// A request as a client sends it: HEADERS without END_STREAM, then DATA with it.
    fn request(stream: u32, body: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        let id = stream.to_be_bytes();
        // HEADERS, 3 bytes of header block, END_HEADERS only.
        bytes.extend_from_slice(&[0, 0, 3, HEADERS, 0x4]);
        bytes.extend_from_slice(&id);
        bytes.extend_from_slice(&[0x83, 0x86, 0x84]);
        let len = u32::try_from(body).unwrap().to_be_bytes();
        bytes.extend_from_slice(&[len[1], len[2], len[3], DATA, END_STREAM]);
        bytes.extend_from_slice(&id);
        bytes.extend(std::iter::repeat_n(7u8, body));
        bytes
    }

    /// The preface, a SETTINGS frame and `count` requests of `body` bytes each.
    fn connection(count: u32, body: usize) -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        for stream in 0..count {
            bytes.extend(request(2 * stream + 1, body));
        }
        bytes
    }

    /// Reads until a read is `Pending`, within one poll of the calling task; returns what
    /// was read and whether the stream ended.
    async fn one_turn<T: AsyncRead + Unpin>(io: &mut PacedIo<T>) -> (Vec<u8>, bool) {
        std::future::poll_fn(|cx| {
            let mut got = Vec::new();
            loop {
                let mut space = [0u8; 4096];
                let mut buf = ReadBuf::new(&mut space);
                match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                        return Poll::Ready((got, true));
                    }
                    Poll::Ready(Ok(())) => got.extend_from_slice(buf.filled()),
                    Poll::Ready(Err(error)) => panic!("read failed: {error}"),
                    Poll::Pending => return Poll::Ready((got, false)),
                }
            }
        })
        .await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_turn_hands_over_at_most_the_limit_of_whole_requests() {
        let sent = connection(20, 5);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        client.write_all(&sent).await.unwrap();
        drop(client);
        let mut io = PacedIo::new(server);
        let head = PREFACE_LEN + FRAME_HEADER_LEN;
        let one = request(1, 5).len();

        let (first, ended) = one_turn(&mut io).await;
        assert!(!ended);
        assert_eq!(first.len(), head + REQUESTS_PER_TURN * one);
        // Still the same turn: nothing more until the tasks queued so far have run.
        let (nothing, _) = one_turn(&mut io).await;
        assert!(nothing.is_empty());

        let mut received = first;
        let mut turns = 1;
        loop {
            tokio::task::yield_now().await;
            let (more, ended) = one_turn(&mut io).await;
            assert!(
                more.len() <= REQUESTS_PER_TURN * one,
                "{} bytes in a turn",
                more.len()
            );
            received.extend(more);
            if ended {
                break;
            }
            turns += 1;
            assert!(turns < 20, "the stream never ended");
        }
        assert_eq!(received, sent, "bytes lost or reordered");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_larger_than_a_read_passes_whole_in_one_turn() {
        let sent = connection(2, 40_000);
        let (mut client, server) = tokio::io::duplex(128 * 1024);
        client.write_all(&sent).await.unwrap();
        drop(client);
        let mut io = PacedIo::new(server);
        let (received, ended) = one_turn(&mut io).await;
        assert_eq!(received, sent);
        assert!(ended);
    }

    #[test]
    fn frames_split_anywhere_are_counted_the_same() {
        let sent = connection(5, 3);
        for cut in 0..sent.len() {
            let mut frames = Frames::new();
            let (a, first) = frames.advance(&sent[..cut], usize::MAX);
            let (b, second) = frames.advance(&sent[cut..], usize::MAX);
            assert_eq!((a + b, first + second), (sent.len(), 5), "cut at {cut}");
        }
        // An empty DATA frame with END_STREAM completes a request with its header.
        let mut frames = Frames::new();
        let mut bytes = vec![0u8; PREFACE_LEN];
        bytes.extend_from_slice(&[0, 0, 0, DATA, END_STREAM, 0, 0, 0, 1]);
        assert_eq!(frames.advance(&bytes, 1), (bytes.len(), 1));
    }
}
