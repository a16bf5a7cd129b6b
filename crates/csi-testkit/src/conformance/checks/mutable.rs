//! Mutable parameters: a key the plugin cannot support is refused, the configured ones are not.

use csi_proto::Rpc;
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use tonic::Code;

use crate::conformance::calls::{Call, expect_code};
use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Undo, verdict};

/// A key no plugin supports. csi-sanity uses one like it; a plugin that accepts it would
/// accept any typing mistake in a volume attribute class.
const UNSUPPORTED_KEY: &str = "csi-conformance.example/unsupported-key";

pub(crate) async fn keys(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::ModifyVolume))?;
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let unsupported =
        std::collections::HashMap::from([(UNSUPPORTED_KEY.to_owned(), "conformance".to_owned())]);
    let mut problems = Vec::new();

    let mut create = ctx.create_request(ctx.unique_name("mutable-unsupported"));
    create.mutable_parameters = unsupported.clone();
    match ctx.create_volume(create).await {
        Ok(answer) => {
            if let Some(volume) = answer.volume {
                ctx.undo(Undo::DeleteVolume(volume.volume_id));
            }
            problems.push(format!(
                "CreateVolume with mutable_parameters key {UNSUPPORTED_KEY:?} answered OK, \
                 expected INVALID_ARGUMENT"
            ));
        }
        Err(err) => {
            if let Err(problem) = expect_code(
                Err::<(), _>(err),
                Rpc::CreateVolume,
                Code::InvalidArgument,
                &format!("mutable_parameters key {UNSUPPORTED_KEY:?}"),
            ) {
                problems.push(problem);
            }
        }
    }

    let volume = ctx.new_volume().await?;
    let modify = v1::ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        secrets: ctx.secrets(),
        mutable_parameters: unsupported,
    };
    let result = ctx.send(Call::ControllerModifyVolume(modify)).await;
    if let Err(problem) = expect_code(
        result,
        Rpc::ControllerModifyVolume,
        Code::InvalidArgument,
        &format!(
            "volume {}, mutable_parameters key {UNSUPPORTED_KEY:?}",
            volume.volume_id
        ),
    ) {
        problems.push(problem);
    }

    // The configured keys are accepted at creation (their modification is the idempotency
    // check's business).
    if !ctx.options.mutable_parameters.is_empty() {
        let mut create = ctx.create_request(ctx.unique_name("mutable-supported"));
        create.mutable_parameters = ctx.options.mutable_parameters.clone();
        match ctx.create_volume(create).await {
            Ok(answer) => {
                if let Some(volume) = answer.volume {
                    ctx.undo(Undo::DeleteVolume(volume.volume_id));
                }
            }
            Err(err) => problems.push(format!(
                "CreateVolume with the configured mutable_parameters: {err}"
            )),
        }
    }
    verdict(problems)
}
