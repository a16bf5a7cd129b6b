//! Forwarding CSI calls to the node that hosts the plugin (not built yet; see issue 6).
