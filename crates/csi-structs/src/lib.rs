//! Domain model placeholder.
