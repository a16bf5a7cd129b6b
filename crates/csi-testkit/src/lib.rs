//! Mock CSI plugin and conformance suite (not built yet; see issue 3).
