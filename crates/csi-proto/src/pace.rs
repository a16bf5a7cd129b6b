//! Reading an HTTP/2 connection a few complete messages at a time.
//!
//! An HTTP/2 endpoint reads every frame the socket holds before it acts on any. When one read
//! holds many messages (32 requests under 32 callers, or 32 answers), all are taken in, all
//! handled, and whatever they lead to is written back in one piece a turn of the connection's
//! task later. Meanwhile the peer has nothing to do, and once it has the batch this side has
//! nothing to do: the two processes take turns instead of working at the same time.
//!
//! [`PacedIo`] hands the HTTP/2 code the bytes of at most a few complete messages at a time
//! (the [`Pace`]). Then its reads stay `Pending` until the tasks queued so far (the calls or
//! callers those messages woke) have run, so what they send goes out while the rest is still
//! being read. Bytes read past the limit are kept for the next turn; nothing is dropped or
//! reordered. A message is complete at the end of a DATA or HEADERS frame that carries
//! END_STREAM (a request's last frame, or an answer's trailers); frames are only counted, never
//! parsed further.
//!
//! The mock plugin reads its connections this way, and csi-client its connections on a
//! current-thread runtime.

use std::fmt;
use std::io;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many complete messages a [`PacedIo`] hands over per turn.
#[derive(Clone, Debug)]
pub enum Pace {
    /// No limit: every byte as it arrives, as if the stream were not wrapped.
    Off,
    /// At most this many per turn.
    Fixed(NonZeroUsize),
    /// A share of the requests in flight: `in_flight / divisor` per turn, at least one. Few
    /// requests in flight are handed over one at a time; many, in bigger batches.
    InFlight {
        /// Requests in flight, kept by the caller.
        in_flight: Arc<AtomicUsize>,
        /// The share's divisor.
        divisor: NonZeroUsize,
    },
}

impl Pace {
    fn per_turn(&self) -> usize {
        match self {
            Pace::Off => usize::MAX,
            Pace::Fixed(limit) => limit.get(),
            Pace::InFlight { in_flight, divisor } => {
                (in_flight.load(Ordering::Relaxed) / divisor.get()).max(1)
            }
        }
    }
}

/// The client connection preface, which comes before the first frame.
const PREFACE_LEN: usize = 24;

/// An HTTP/2 frame header's length.
const FRAME_HEADER_LEN: usize = 9;

/// The frame types that can end a stream.
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;

/// The END_STREAM flag of DATA and HEADERS frames.
const END_STREAM: u8 = 0x1;

/// Where the bytes handed over so far stand in the peer's frame sequence.
#[derive(Debug)]
struct Frames {
    /// Bytes left of the preface or of the current frame's payload.
    skip: usize,
    /// The next frame's header, as far as it has arrived.
    header: [u8; FRAME_HEADER_LEN],
    /// Bytes of `header` arrived so far.
    have: usize,
    /// The current frame ends a stream: a message is complete with its last byte.
    ends_stream: bool,
}

impl Frames {
    fn new(preface: usize) -> Self {
        Frames {
            skip: preface,
            header: [0; FRAME_HEADER_LEN],
            have: 0,
            ends_stream: false,
        }
    }

    /// Follows `bytes` until the end of the `limit`-th message completed in them. Returns how
    /// many bytes that is (all of them when fewer messages complete) and how many messages
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

/// A stream that hands its HTTP/2 reader at most a [`Pace`] of complete messages per turn
/// (see the module docs). Writes pass straight through.
///
/// It must be read inside a tokio runtime: ending a turn spawns a small task.
pub struct PacedIo<T> {
    inner: T,
    pace: Pace,
    /// Bytes read from `inner` but held back for a later turn.
    held: Vec<u8>,
    /// How much of `held` was handed over.
    held_from: usize,
    frames: Frames,
    /// Messages completed in this turn.
    handed: usize,
    /// Set when a turn ends; cleared by a task queued behind the ones the turn started.
    waiting: Arc<AtomicBool>,
}

/// Shows the pace and how much is held back, never the bytes: they may carry a request's
/// secrets.
impl<T: fmt::Debug> fmt::Debug for PacedIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedIo")
            .field("inner", &self.inner)
            .field("pace", &self.pace)
            .field("held_bytes", &(self.held.len() - self.held_from))
            .field("handed", &self.handed)
            .finish_non_exhaustive()
    }
}

impl<T> PacedIo<T> {
    /// The server's side of a connection: the client's 24-byte preface comes first.
    pub fn server(inner: T, pace: Pace) -> Self {
        Self::new(inner, pace, PREFACE_LEN)
    }

    /// The client's side of a connection: frames from the first byte.
    pub fn client(inner: T, pace: Pace) -> Self {
        Self::new(inner, pace, 0)
    }

    fn new(inner: T, pace: Pace, preface: usize) -> Self {
        PacedIo {
            inner,
            pace,
            held: Vec::new(),
            held_from: 0,
            frames: Frames::new(preface),
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
        if let Pace::Off = this.pace {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if this.waiting.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        let per_turn = this.pace.per_turn();
        if this.handed >= per_turn {
            this.end_turn(cx);
            return Poll::Pending;
        }
        let limit = per_turn - this.handed;
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

    const PER_TURN: usize = 8;

    fn fixed(n: usize) -> Pace {
        Pace::Fixed(NonZeroUsize::new(n).unwrap())
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut bytes = vec![len[1], len[2], len[3], kind, flags];
        bytes.extend_from_slice(&stream.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    /// A request as a client sends it: HEADERS without END_STREAM, then DATA with it.
    fn request(stream: u32, body: usize) -> Vec<u8> {
        let mut bytes = frame(HEADERS, 0x4, stream, &[0x83, 0x86, 0x84]);
        bytes.extend(frame(DATA, END_STREAM, stream, &vec![7u8; body]));
        bytes
    }

    /// An answer as a server sends it: HEADERS, DATA, then trailers with END_STREAM.
    fn answer(stream: u32) -> Vec<u8> {
        let mut bytes = frame(HEADERS, 0x4, stream, &[0x88]);
        bytes.extend(frame(DATA, 0, stream, &[0, 0, 0, 0, 2, 8, 1]));
        bytes.extend(frame(HEADERS, 0x4 | END_STREAM, stream, &[0xc0]));
        bytes
    }

    /// The preface, a SETTINGS frame and `count` requests of `body` bytes each.
    fn connection(count: u32, body: usize) -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 0, &[]));
        for stream in 0..count {
            bytes.extend(request(2 * stream + 1, body));
        }
        bytes
    }

    /// A stream holding `sent` and then its end.
    async fn holding(sent: &[u8]) -> tokio::io::DuplexStream {
        let (mut peer, ours) = tokio::io::duplex(sent.len() + 1);
        peer.write_all(sent).await.unwrap();
        ours
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

    /// Every turn until the stream ends, letting queued tasks run between turns.
    async fn all_turns<T: AsyncRead + Unpin>(io: &mut PacedIo<T>) -> Vec<Vec<u8>> {
        let mut turns = Vec::new();
        loop {
            let (got, ended) = one_turn(io).await;
            turns.push(got);
            if ended {
                return turns;
            }
            assert!(turns.len() < 100, "the stream never ended");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_turn_hands_over_at_most_the_limit_of_whole_requests() {
        let sent = connection(20, 5);
        let mut io = PacedIo::server(holding(&sent).await, fixed(PER_TURN));
        let head = PREFACE_LEN + FRAME_HEADER_LEN;
        let one = request(1, 5).len();

        let (first, ended) = one_turn(&mut io).await;
        assert!(!ended);
        assert_eq!(first.len(), head + PER_TURN * one);
        // Still the same turn: nothing more until the tasks queued so far have run.
        let (nothing, _) = one_turn(&mut io).await;
        assert!(nothing.is_empty());

        tokio::task::yield_now().await;
        let rest = all_turns(&mut io).await;
        let sizes: Vec<usize> = rest.iter().map(Vec::len).collect();
        // The last four are read to the end of the stream in one turn.
        assert_eq!(sizes, [PER_TURN * one, 4 * one]);
        let received: Vec<u8> = std::iter::once(first).chain(rest).flatten().collect();
        assert_eq!(received, sent, "bytes lost or reordered");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_larger_than_a_read_passes_whole_in_one_turn() {
        let sent = connection(2, 40_000);
        let mut io = PacedIo::server(holding(&sent).await, fixed(PER_TURN));
        let (received, ended) = one_turn(&mut io).await;
        assert_eq!(received, sent);
        assert!(ended);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_client_takes_a_share_of_the_answers_in_flight_per_turn() {
        let sent: Vec<u8> = (0..12).flat_map(|i| answer(2 * i + 1)).collect();
        let one = answer(1).len();
        let in_flight = Arc::new(AtomicUsize::new(12));
        let pace = Pace::InFlight {
            in_flight: Arc::clone(&in_flight),
            divisor: NonZeroUsize::new(4).unwrap(),
        };
        let mut io = PacedIo::client(holding(&sent).await, pace);
        // 12 in flight: 3 per turn.
        let (first, _) = one_turn(&mut io).await;
        assert_eq!(first.len(), 3 * one);
        // 2 in flight: one per turn, never none.
        in_flight.store(2, Ordering::Relaxed);
        tokio::task::yield_now().await;
        let rest = all_turns(&mut io).await;
        let sizes: Vec<usize> = rest.iter().map(Vec::len).collect();
        assert_eq!(sizes, [one; 9].into_iter().chain([0]).collect::<Vec<_>>());
        let received: Vec<u8> = std::iter::once(first).chain(rest).flatten().collect();
        assert_eq!(received, sent);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn off_hands_over_everything_in_one_turn() {
        let sent: Vec<u8> = (0..40).flat_map(|i| answer(2 * i + 1)).collect();
        let mut io = PacedIo::client(holding(&sent).await, Pace::Off);
        let (received, ended) = one_turn(&mut io).await;
        assert_eq!(received, sent);
        assert!(ended);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn debug_shows_how_much_is_held_never_the_bytes() {
        let mut sent = connection(10, 0);
        sent.extend(frame(DATA, END_STREAM, 99, b"password=hunter2"));
        let mut io = PacedIo::server(holding(&sent).await, fixed(PER_TURN));
        let (_, _) = one_turn(&mut io).await;
        let printed = format!("{io:?}");
        assert!(printed.contains("held_bytes"), "{printed}");
        assert!(!printed.contains("104, 117, 110"), "{printed}"); // "hun"
        assert!(!printed.contains("hunter2"), "{printed}");
    }

    #[test]
    fn frames_split_anywhere_are_counted_the_same() {
        let sent = connection(5, 3);
        for cut in 0..sent.len() {
            let mut frames = Frames::new(PREFACE_LEN);
            let (a, first) = frames.advance(&sent[..cut], usize::MAX);
            let (b, second) = frames.advance(&sent[cut..], usize::MAX);
            assert_eq!((a + b, first + second), (sent.len(), 5), "cut at {cut}");
        }
        // An empty DATA frame with END_STREAM completes a message with its header.
        let mut frames = Frames::new(0);
        let bytes = frame(DATA, END_STREAM, 1, &[]);
        assert_eq!(frames.advance(&bytes, 1), (bytes.len(), 1));
    }
}
