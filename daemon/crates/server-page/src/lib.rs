//! The model server's own signals, from text: its Prometheus page (`parse`, tolerant: a bad
//! line is skipped and counted, never the page), the families normalized per server kind
//! (`normalize`: vLLM old and new, SGLang, TGI, llama.cpp → `Reading`), two readings into a
//! sample (`interval`: counter rates with reset detection, histogram deltas, `quantile`), and
//! the info routes' JSON (`identity`), a router's registered workers (`workers`) and its
//! picks per worker (`router_picks`), a disaggregated deployment's prefill and decode pools
//! (`pool_load`). No IO and
//! no clock: the scraper (`lmperf::server::scrape`)
//! fetches and passes the times.

pub mod identity;
pub mod interval;
pub mod normalize;
pub mod parse;
pub mod picker_pool;
pub mod pool_load;
pub mod quantile;
pub mod router_list;
pub mod router_picks;
pub mod workers;

pub use identity::{Change, ChangeKind, Identity};
pub use interval::{LatencyStats, ServerSample};
pub use normalize::{Reading, ServerKind};
