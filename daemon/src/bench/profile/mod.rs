//! Load profiles in `lmperf run`: the profile itself lives in [`crate::load::profile`]
//! (re-exported here under its old path); [`run`] runs one against the server.

pub mod run;

pub use crate::load::profile::*;
