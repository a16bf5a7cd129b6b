//! Typed CSI clients over unix sockets (not built yet; see issue 4).
