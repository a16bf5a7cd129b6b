//! Volume-claim state machines and the release pipeline (not built yet; see issue 5).
