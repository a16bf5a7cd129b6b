//! csi-claims' detacher traits implemented with csi-client.
