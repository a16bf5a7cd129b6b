//! The codec of every generated client and server: prost's, with a first buffer sized for
//! CSI's messages.
//!
//! tonic's default gives each call an 8 KiB buffer to encode its request into and another to
//! decode its answer from: two allocations of 8 KiB on every unary call, on both sides of the
//! connection, where a CSI message is usually well under a kilobyte (a Probe answer is 4
//! bytes; a `NodeStageVolumeRequest` with a few context keys, a few hundred). The buffers
//! start at [`BUFFER_SIZE`] here and grow as a larger message needs, so nothing changes for a
//! page of a long listing but its first reallocations.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first size of the buffer a message is encoded into or decoded from (tonic's default
/// is 8 KiB). Small enough for the allocator's per-thread cache.
pub const BUFFER_SIZE: usize = 1024;

/// How much a stream encodes before it lets other tasks run (tonic's default, 32 KiB).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

/// prost's codec with [`BUFFER_SIZE`] buffers; the generated clients and servers use it.
#[derive(Debug, Clone, Copy)]
pub struct CsiCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CsiCodec<T, U> {
    fn default() -> Self {
        CsiCodec(PhantomData)
    }
}

impl<T, U> Codec for CsiCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(settings())
    }
}
