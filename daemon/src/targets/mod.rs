//! The agent's targets at run time: static `[[target]]` tables and discovered pods go through
//! one path, a desired-target snapshot that [`set::TargetSet`] reconciles.

pub mod set;

pub use crate::live_list::LiveList;
pub use set::{Applied, Shared, TargetSet};
