//! Property tests for capability confirmation: reflexive, order-insensitive for mount flags
//! and for the order of capabilities, and sensitive to any single changed field.

mod support;

use csi_structs::confirm::{
    AskedCapabilities, ConfirmPolicy, Confirmation, Confirmed, ConfirmedCapability, Mismatch,
    ValidationResponse, confirm,
};
use csi_structs::{AccessMode, AccessType, MountOptions, VolumeCapability};
use proptest::prelude::*;
use support::*;

fn policy() -> impl Strategy<Value = ConfirmPolicy> {
    prop_oneof![Just(ConfirmPolicy::Strict), Just(ConfirmPolicy::Lenient)]
}

fn asked() -> impl Strategy<Value = AskedCapabilities> {
    (
        capabilities(),
        volume_context(),
        parameters(),
        mutable_parameters(),
    )
        .prop_map(|(caps, ctx, p, m)| {
            let mut a = AskedCapabilities::new(caps);
            a.volume_context = ctx;
            a.parameters = p;
            a.mutable_parameters = m;
            a
        })
}

fn reorder_flags(cap: &VolumeCapability, seed: usize) -> VolumeCapability {
    match &cap.access_type {
        AccessType::Block => cap.clone(),
        AccessType::Mount(m) => {
            let mut flags: Vec<String> = m.mount_flags().as_slice().to_vec();
            if !flags.is_empty() {
                let n = flags.len();
                flags.rotate_left(seed % n);
                // Repeat one flag: repetition does not matter either.
                flags.push(flags[seed % n].clone());
            }
            let mut opts = MountOptions::new().with_flags(flags);
            if let Some(fs) = m.fs_type() {
                opts = opts.with_fs_type(fs);
            }
            if let Some(g) = m.volume_mount_group() {
                opts = opts.with_volume_mount_group(g);
            }
            VolumeCapability::mount(cap.access_mode, opts)
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn confirming_exactly_what_was_asked_passes(a in asked(), p in policy()) {
        let answer = ValidationResponse::confirmed(Confirmed::echo(&a));
        prop_assert_eq!(confirm(&a, &answer, p), Confirmation::Confirmed);
    }

    #[test]
    fn order_of_flags_and_capabilities_does_not_matter(a in asked(), seed in any::<usize>(), p in policy()) {
        let mut caps: Vec<ConfirmedCapability> = a
            .volume_capabilities
            .iter()
            .map(|c| ConfirmedCapability::from(&reorder_flags(c, seed)))
            .collect();
        let n = caps.len();
        caps.rotate_right(seed % n);
        let mut confirmed = Confirmed::echo(&a);
        confirmed.volume_capabilities = caps;
        prop_assert_eq!(confirm(&a, &ValidationResponse::confirmed(confirmed), p), Confirmation::Confirmed);
    }

    #[test]
    fn a_changed_mode_is_caught(a in asked(), p in policy(), idx in any::<usize>()) {
        let i = idx % a.volume_capabilities.len();
        let original = a.volume_capabilities[i].clone();
        // Pick a mode no requested capability with the same type uses, so no other entry can
        // explain the changed one away.
        let other = AccessMode::ALL.into_iter().find(|m| {
            a.volume_capabilities.iter().all(|c| !(c.access_mode == *m && c.access_type == original.access_type))
        });
        prop_assume!(other.is_some());
        let mut confirmed = Confirmed::echo(&a);
        confirmed.volume_capabilities[i] = ConfirmedCapability::from(&VolumeCapability::new(other.unwrap(), original.access_type.clone()));
        let got = confirm(&a, &ValidationResponse::confirmed(confirmed), p);
        prop_assert!(!got.is_accepted());
        let mentions_mode = got.mismatches().iter().any(|m| matches!(
            m,
            Mismatch::AccessMode { .. }
                | Mismatch::CapabilityNotConfirmed { .. }
                | Mismatch::UnrequestedCapability { .. }
        ));
        prop_assert!(mentions_mode, "{:?}", got);
    }

    #[test]
    fn mismatch_text_never_contains_a_mount_flag(a in asked(), p in policy()) {
        // Confirm every capability with all flags dropped.
        let mut confirmed = Confirmed::echo(&a);
        for (c, orig) in confirmed.volume_capabilities.iter_mut().zip(&a.volume_capabilities) {
            if let AccessType::Mount(m) = &orig.access_type {
                let mut opts = MountOptions::new();
                if let Some(fs) = m.fs_type() { opts = opts.with_fs_type(fs); }
                if let Some(g) = m.volume_mount_group() { opts = opts.with_volume_mount_group(g); }
                c.access_type = Some(AccessType::Mount(opts));
            }
        }
        let got = confirm(&a, &ValidationResponse::confirmed(confirmed), p);
        let text = format!("{got:?} {}", got.mismatches().iter().map(ToString::to_string).collect::<Vec<_>>().join(" "));
        for cap in &a.volume_capabilities {
            if let Some(m) = cap.mount_options() {
                for flag in m.mount_flags().iter().filter(|f| f.contains('=')) {
                    prop_assert!(!text.contains(flag), "{flag} leaked in {text}");
                }
            }
        }
    }
}
