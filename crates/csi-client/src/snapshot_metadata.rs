//! The SnapshotMetadata service (alpha): server-streaming block metadata.
//!
//! A [`MetadataStream`] checks the stream contract as messages arrive: ranges strictly
//! ascending and non-overlapping across the whole stream, the same `block_metadata_type` and
//! `volume_capacity_bytes` in every message, equal sizes for FIXED_LENGTH. It tracks
//! [`resume_offset`](MetadataStream::resume_offset), the `starting_offset` to send to resume
//! after an error (spec §2.5). A clean end of stream is the only "done".

use std::time::Duration;

use csi_proto::v1 as pb;
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient as Raw;
use tokio::time::Instant;

use crate::answer::AnswerWatch;
use crate::call::{OpenStream, kind_of_status};
use crate::error::{CallContext, DeadlineScope, Elapsed, Error, ErrorKind, ResponseError};
use crate::policy::classify_failure;
use crate::service::service_client;
use crate::validate::{Checker, check_block_metadata};

service_client!(
    /// Client of the SnapshotMetadata service (alpha). Cheap to clone; shares the connection
    /// of the [`CsiClient`](crate::CsiClient) it came from.
    SnapshotMetadataClient
);

impl SnapshotMetadataClient {
    /// `GetMetadataAllocated`: the allocated ranges of one snapshot, as a checked stream.
    ///
    /// # Errors
    ///
    /// Failure to open the stream (retried per policy); later failures come from
    /// [`MetadataStream::message`].
    pub async fn get_metadata_allocated(
        &self,
        request: pb::GetMetadataAllocatedRequest,
    ) -> Result<MetadataStream<pb::GetMetadataAllocatedResponse>, Error> {
        let (stream, context, policy, started) = self
            .caller
            .open_stream(&self.options, request, |ch, req| async move {
                Raw::new(ch).get_metadata_allocated(req).await
            })
            .await?;
        Ok(MetadataStream::new(
            stream,
            context,
            policy.attempt_deadline,
            policy.total_budget,
            started,
        ))
    }

    /// `GetMetadataDelta`: the ranges changed between two snapshots, as a checked stream.
    ///
    /// # Errors
    ///
    /// As [`get_metadata_allocated`](Self::get_metadata_allocated).
    pub async fn get_metadata_delta(
        &self,
        request: pb::GetMetadataDeltaRequest,
    ) -> Result<MetadataStream<pb::GetMetadataDeltaResponse>, Error> {
        let (stream, context, policy, started) = self
            .caller
            .open_stream(&self.options, request, |ch, req| async move {
                Raw::new(ch).get_metadata_delta(req).await
            })
            .await?;
        Ok(MetadataStream::new(
            stream,
            context,
            policy.attempt_deadline,
            policy.total_budget,
            started,
        ))
    }
}

/// A message of a snapshot-metadata stream.
pub trait MetadataMessage: Send + 'static {
    /// `block_metadata_type` (wire number).
    fn block_metadata_type(&self) -> i32;
    /// `volume_capacity_bytes`.
    fn volume_capacity_bytes(&self) -> i64;
    /// The ranges in this message.
    fn block_metadata(&self) -> &[pb::BlockMetadata];
}

impl MetadataMessage for pb::GetMetadataAllocatedResponse {
    fn block_metadata_type(&self) -> i32 {
        self.block_metadata_type
    }
    fn volume_capacity_bytes(&self) -> i64 {
        self.volume_capacity_bytes
    }
    fn block_metadata(&self) -> &[pb::BlockMetadata] {
        &self.block_metadata
    }
}

impl MetadataMessage for pb::GetMetadataDeltaResponse {
    fn block_metadata_type(&self) -> i32 {
        self.block_metadata_type
    }
    fn volume_capacity_bytes(&self) -> i64 {
        self.volume_capacity_bytes
    }
    fn block_metadata(&self) -> &[pb::BlockMetadata] {
        &self.block_metadata
    }
}

/// The contract state of a stream, independent of I/O (tested on its own).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Contract {
    shape: Option<(i32, i64)>,
    fixed_size: Option<i64>,
    next_offset: Option<i64>,
}

impl Contract {
    fn accept<T: MetadataMessage>(&mut self, msg: &T) -> Result<(), ResponseError> {
        let mut c = Checker::default();
        check_block_metadata(&mut c, msg.volume_capacity_bytes(), msg.block_metadata());
        c.finish().map_err(ResponseError::Fields)?;
        let shape = (msg.block_metadata_type(), msg.volume_capacity_bytes());
        match self.shape {
            None => self.shape = Some(shape),
            Some((t, _)) if t != shape.0 => {
                return Err(ResponseError::StreamShapeChanged {
                    field: "block_metadata_type",
                    before: i64::from(t),
                    after: i64::from(shape.0),
                });
            }
            Some((_, cap)) if cap != shape.1 => {
                return Err(ResponseError::StreamShapeChanged {
                    field: "volume_capacity_bytes",
                    before: cap,
                    after: shape.1,
                });
            }
            Some(_) => {}
        }
        let fixed = shape.0 == pb::BlockMetadataType::FixedLength as i32;
        for b in msg.block_metadata() {
            if let Some(prev_end) = self.next_offset
                && b.byte_offset < prev_end
            {
                return Err(ResponseError::RangeOutOfOrder {
                    byte_offset: b.byte_offset,
                    previous_end: prev_end,
                });
            }
            if fixed {
                match self.fixed_size {
                    None => self.fixed_size = Some(b.size_bytes),
                    Some(expected) if expected != b.size_bytes => {
                        return Err(ResponseError::UnequalFixedLength {
                            expected,
                            size_bytes: b.size_bytes,
                        });
                    }
                    Some(_) => {}
                }
            }
            self.next_offset = Some(b.byte_offset.saturating_add(b.size_bytes));
        }
        Ok(())
    }
}

/// A checked stream of snapshot-metadata messages.
///
/// Each message must arrive within the RPC's attempt deadline of the previous one, and the
/// whole stream within its total budget. After an error, open a new stream with
/// `starting_offset` = [`resume_offset`](Self::resume_offset).
#[derive(Debug)]
pub struct MetadataStream<T> {
    inner: tonic::Streaming<T>,
    answer: AnswerWatch,
    context: CallContext,
    idle: Duration,
    total: Duration,
    deadline: Instant,
    contract: Contract,
    received: u64,
    done: bool,
}

impl<T: MetadataMessage> MetadataStream<T> {
    fn new(
        (inner, answer): OpenStream<T>,
        context: CallContext,
        idle: Duration,
        total: Duration,
        started: Instant,
    ) -> Self {
        MetadataStream {
            inner,
            answer,
            context,
            idle,
            total,
            deadline: started + total,
            contract: Contract::default(),
            received: 0,
            done: false,
        }
    }

    /// The next message, or `None` at the clean end of the stream.
    ///
    /// # Errors
    ///
    /// A status or transport failure mid-stream, an idle or total deadline, or a message that
    /// breaks the stream contract (then the stream ends).
    pub async fn message(&mut self) -> Result<Option<T>, Error> {
        if self.done {
            return Ok(None);
        }
        let now = Instant::now();
        let (limit, scope) = if now + self.idle >= self.deadline {
            (self.deadline, Elapsed::new(DeadlineScope::Call, self.total))
        } else {
            (
                now + self.idle,
                Elapsed::new(DeadlineScope::Attempt, self.idle),
            )
        };
        let kind = match tokio::time::timeout_at(limit, self.inner.message()).await {
            Ok(Ok(Some(msg))) => match self.contract.accept(&msg) {
                Ok(()) => {
                    self.received += 1;
                    return Ok(Some(msg));
                }
                Err(e) => ErrorKind::InvalidResponse(e),
            },
            Ok(Ok(None)) => {
                self.done = true;
                return Ok(None);
            }
            Ok(Err(status)) => kind_of_status(status, &self.answer),
            Err(_) => ErrorKind::Timeout(scope),
        };
        self.done = true;
        let class = classify_failure(self.context.rpc(), kind.failure());
        Err(Error::new(self.context.clone(), kind, class, 1))
    }

    /// The `starting_offset` that resumes after the last range received (0 before any).
    pub fn resume_offset(&self) -> i64 {
        self.contract.next_offset.unwrap_or(0)
    }

    /// Messages received so far.
    pub fn messages_received(&self) -> u64 {
        self.received
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(
        kind: pb::BlockMetadataType,
        cap: i64,
        ranges: &[(i64, i64)],
    ) -> pb::GetMetadataAllocatedResponse {
        pb::GetMetadataAllocatedResponse {
            block_metadata_type: kind as i32,
            volume_capacity_bytes: cap,
            block_metadata: ranges
                .iter()
                .map(|&(byte_offset, size_bytes)| pb::BlockMetadata {
                    byte_offset,
                    size_bytes,
                })
                .collect(),
        }
    }

    #[test]
    fn contract_accepts_ascending_ranges_and_tracks_resume_offset() {
        let mut c = Contract::default();
        c.accept(&msg(
            pb::BlockMetadataType::VariableLength,
            100,
            &[(0, 10), (10, 5)],
        ))
        .unwrap();
        c.accept(&msg(
            pb::BlockMetadataType::VariableLength,
            100,
            &[(40, 20)],
        ))
        .unwrap();
        assert_eq!(c.next_offset, Some(60));
    }

    #[test]
    fn contract_rejects_overlap_shape_changes_and_unequal_fixed_sizes() {
        let mut c = Contract::default();
        c.accept(&msg(pb::BlockMetadataType::VariableLength, 100, &[(0, 10)]))
            .unwrap();
        assert_eq!(
            c.accept(&msg(pb::BlockMetadataType::VariableLength, 100, &[(5, 10)])),
            Err(ResponseError::RangeOutOfOrder {
                byte_offset: 5,
                previous_end: 10
            })
        );
        let mut c = Contract::default();
        c.accept(&msg(pb::BlockMetadataType::VariableLength, 100, &[(0, 10)]))
            .unwrap();
        assert!(matches!(
            c.accept(&msg(
                pb::BlockMetadataType::VariableLength,
                200,
                &[(20, 10)]
            )),
            Err(ResponseError::StreamShapeChanged {
                field: "volume_capacity_bytes",
                ..
            })
        ));
        let mut c = Contract::default();
        c.accept(&msg(pb::BlockMetadataType::FixedLength, 100, &[(0, 4)]))
            .unwrap();
        assert_eq!(
            c.accept(&msg(pb::BlockMetadataType::FixedLength, 100, &[(8, 8)])),
            Err(ResponseError::UnequalFixedLength {
                expected: 4,
                size_bytes: 8
            })
        );
        let mut c = Contract::default();
        assert!(matches!(
            c.accept(&msg(pb::BlockMetadataType::VariableLength, 100, &[(0, 0)])),
            Err(ResponseError::Fields(_))
        ));
    }
}
