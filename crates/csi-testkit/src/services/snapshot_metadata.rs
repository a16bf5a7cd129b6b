//! SnapshotMetadata: the two server-streaming rpcs, resumable from `starting_offset`.

use csi_proto::Rpc;
use csi_proto::v1::snapshot_metadata_server::SnapshotMetadata;
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::dispatch::{Target, VecStream};
use crate::metadata;
use crate::plugin::MockPlugin;
use crate::services::Svc;
use crate::validate;

/// Tuples per message when the caller leaves `max_results` at 0.
const DEFAULT_MAX_RESULTS: usize = 128;

fn check_window(starting_offset: i64, max_results: i32) -> Result<usize, Status> {
    if starting_offset < 0 {
        return Err(Status::out_of_range(format!(
            "starting_offset {starting_offset} is negative"
        )));
    }
    match usize::try_from(max_results) {
        Ok(0) => Ok(DEFAULT_MAX_RESULTS),
        Ok(n) => Ok(n),
        Err(_) => Err(Status::invalid_argument(format!(
            "max_results is {max_results}; it must not be negative"
        ))),
    }
}

fn check_offset(starting_offset: i64, capacity: i64) -> Result<(), Status> {
    if starting_offset > capacity {
        return Err(Status::out_of_range(format!(
            "starting_offset {starting_offset} is beyond the volume size ({capacity} bytes)"
        )));
    }
    Ok(())
}

impl MockPlugin {
    fn allocated(
        &self,
        req: &GetMetadataAllocatedRequest,
    ) -> Result<Vec<GetMetadataAllocatedResponse>, Status> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let per_message = check_window(req.starting_offset, req.max_results)?;
        let (seq, capacity) = {
            let inner = self.shared.lock();
            let snapshot = inner.state.snapshots.get(&req.snapshot_id).ok_or_else(|| {
                Status::not_found(format!("snapshot {} does not exist", req.snapshot_id))
            })?;
            (snapshot.seq, snapshot.size)
        };
        check_offset(req.starting_offset, capacity)?;
        let blocks = metadata::after(metadata::allocated(seq, capacity), req.starting_offset);
        Ok(blocks
            .chunks(per_message)
            .map(|chunk| GetMetadataAllocatedResponse {
                block_metadata_type: BlockMetadataType::FixedLength as i32,
                volume_capacity_bytes: capacity,
                block_metadata: chunk.to_vec(),
            })
            .collect())
    }

    fn delta(
        &self,
        req: &GetMetadataDeltaRequest,
    ) -> Result<Vec<GetMetadataDeltaResponse>, Status> {
        validate::required("base_snapshot_id", &req.base_snapshot_id)?;
        validate::required("target_snapshot_id", &req.target_snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let per_message = check_window(req.starting_offset, req.max_results)?;
        let (base_seq, target_seq, capacity) = {
            let inner = self.shared.lock();
            let find = |id: &str, which: &str| {
                inner.state.snapshots.get(id).ok_or_else(|| {
                    Status::not_found(format!("{which} snapshot {id} does not exist"))
                })
            };
            let base = find(&req.base_snapshot_id, "base")?;
            let target = find(&req.target_snapshot_id, "target")?;
            if base.source_volume_id != target.source_volume_id {
                return Err(Status::invalid_argument(format!(
                    "base snapshot {} is of volume {} but target snapshot {} is of volume {}",
                    base.id, base.source_volume_id, target.id, target.source_volume_id
                )));
            }
            if base.seq >= target.seq {
                return Err(Status::invalid_argument(format!(
                    "target snapshot {} must have been taken after base snapshot {}",
                    target.id, base.id
                )));
            }
            (base.seq, target.seq, target.size)
        };
        check_offset(req.starting_offset, capacity)?;
        let blocks = metadata::after(
            metadata::delta(base_seq, target_seq, capacity),
            req.starting_offset,
        );
        Ok(blocks
            .chunks(per_message)
            .map(|chunk| GetMetadataDeltaResponse {
                block_metadata_type: BlockMetadataType::FixedLength as i32,
                volume_capacity_bytes: capacity,
                block_metadata: chunk.to_vec(),
            })
            .collect())
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for Svc {
    type GetMetadataAllocatedStream = VecStream<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = VecStream<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetMetadataAllocated, &request, Target::none())
            .await?;
        scope.finish_stream(self.0.allocated(request.get_ref()))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetMetadataDelta, &request, Target::none())
            .await?;
        scope.finish_stream(self.0.delta(request.get_ref()))
    }
}
