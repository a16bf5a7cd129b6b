//! Property tests for the volume merge: orchestrator-owned fields never change, a failed
//! merge changes nothing, and omitted fields are kept.

mod support;

use csi_structs::registration::{VolumeField, VolumeUpdate, VolumeUsage};
use proptest::prelude::*;
use support::*;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn merge_never_changes_orchestrator_owned_fields(
        (stored, update, usage) in registered().prop_flat_map(|v| {
            let update = update_for(&v);
            (Just(v), update, usage())
        })
    ) {
        let before = stored.clone();
        match stored.merge(update.clone(), &usage) {
            Ok(merged) => {
                prop_assert_eq!(merged.volume.owned(), stored.owned());
                prop_assert_eq!(merged.volume.id(), stored.id());
                // Omitted fields are kept as they were.
                if update.secrets.is_none() {
                    prop_assert_eq!(&merged.volume.spec().secrets, &stored.spec().secrets);
                }
                if update.volume_context.is_none() {
                    prop_assert_eq!(&merged.volume.spec().volume_context, &stored.spec().volume_context);
                }
                if update.plugin_id.is_none() {
                    prop_assert_eq!(&merged.volume.spec().plugin_id, &stored.spec().plugin_id);
                }
                // Immutable-once-set fields that were set are unchanged.
                if !stored.spec().parameters.is_empty() {
                    prop_assert_eq!(&merged.volume.spec().parameters, &stored.spec().parameters);
                }
                if stored.spec().external_id.is_some() {
                    prop_assert_eq!(&merged.volume.spec().external_id, &stored.spec().external_id);
                }
                // The change set is exact for the fields it reports.
                prop_assert_eq!(
                    merged.changed.contains(&VolumeField::Secrets),
                    merged.volume.spec().secrets != stored.spec().secrets
                );
            }
            Err(e) => {
                prop_assert!(!e.errors.is_empty());
                prop_assert_eq!(&e.volume, stored.id());
            }
        }
        prop_assert_eq!(stored, before);
    }

    /// The success path is exercised: an update that only repeats stored values or touches
    /// mutable fields always merges when the volume is not in use.
    #[test]
    fn mutable_only_updates_merge(
        stored in registered(),
        secrets in secrets(),
        mutable in mutable_parameters(),
    ) {
        prop_assume!(stored.spec().validate().is_ok());
        let mut update = VolumeUpdate::new(stored.id().clone());
        update.secrets = Some(secrets.clone());
        update.mutable_parameters = Some(mutable.clone());
        update.parameters = Some(stored.spec().parameters.clone());
        let merged = stored.merge(update, &VolumeUsage::NotInUse).unwrap();
        prop_assert_eq!(merged.volume.owned(), stored.owned());
        prop_assert_eq!(&merged.volume.spec().secrets, &secrets);
        prop_assert_eq!(&merged.volume.spec().mutable_parameters, &mutable);
        prop_assert!(!merged.changed.contains(&VolumeField::Parameters));
    }

    #[test]
    fn empty_update_is_a_no_op(stored in registered(), usage in usage()) {
        // Skip stored specs that are themselves invalid under the merge's validation.
        prop_assume!(stored.spec().validate().is_ok());
        let merged = stored.merge(VolumeUpdate::new(stored.id().clone()), &usage).unwrap();
        prop_assert!(merged.changed.is_empty());
        prop_assert_eq!(merged.volume, stored);
    }

    #[test]
    fn reregistering_the_same_spec_changes_nothing(stored in registered()) {
        prop_assume!(stored.spec().validate().is_ok());
        let update = VolumeUpdate::from_spec(stored.spec().clone());
        let merged = stored.merge(update, &VolumeUsage::NotInUse).unwrap();
        prop_assert!(merged.changed.is_empty(), "{:?}", merged.changed);
        prop_assert_eq!(merged.volume, stored);
    }
}
