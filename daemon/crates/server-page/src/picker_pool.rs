//! llm-d's endpoint picker on its pool (issue 52.3): the requests its flow control holds back,
//! how saturated it finds the pool, and its ready endpoints, so that a router queueing requests
//! in front of idle pods (GIE #2928: over a second inside the picker) shows on its own page.
//!
//! Names from llm-d/llm-d-router `pkg/epp/metrics/llm_d_router_metrics.go` (subsystem
//! `llm_d_epp`, `llm_d_router_epp` since 2026), newest first, then the Gateway API Inference
//! Extension's older names, which a picker exports beside the new ones: only the first family
//! of each group found on a page is read.
//! - `*_flow_control_queue_size{fairness_id, priority, inference_pool, model_name,
//!   target_model_name}` "Current number of requests actively held in the Flow Control queue"
//!   (`inference_extension_flow_control_queue_size`): summed over its series;
//! - `*_flow_control_pool_saturation{inference_pool}` "Current saturation level of the
//!   inference pool (0.0 = empty, 1.0 = fully saturated)"
//!   (`inference_extension_flow_control_pool_saturation`): the most saturated pool;
//! - `*_ready_endpoints{name}` "The number of ready endpoints in the inference server pool"
//!   (`inference_pool_ready_pods`): summed over pools.

use serde::{Deserialize, Serialize};

use super::parse::Page;

/// The flow control queue's families, newest first.
pub const QUEUE: [&str; 3] = [
    "llm_d_router_epp_flow_control_queue_size",
    "llm_d_epp_flow_control_queue_size",
    "inference_extension_flow_control_queue_size",
];
/// The pool saturation's families, newest first.
pub const SATURATION: [&str; 3] = [
    "llm_d_router_epp_flow_control_pool_saturation",
    "llm_d_epp_flow_control_pool_saturation",
    "inference_extension_flow_control_pool_saturation",
];
/// The ready endpoints' families, newest first.
pub const READY: [&str; 3] = [
    "llm_d_router_epp_ready_endpoints",
    "llm_d_epp_ready_endpoints",
    "inference_pool_ready_pods",
];

/// Whether `name` is one of the families read here.
pub fn reads(name: &str) -> bool {
    QUEUE.contains(&name) || SATURATION.contains(&name) || READY.contains(&name)
}

/// What the picker says of its pool; each field `None` when its page does not say it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PickerPool {
    /// Requests held in the flow control queue (every fairness id, priority, pool and model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control_queue: Option<f64>,
    /// The most saturated pool's saturation, 0 (empty) to 1 (saturated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation: Option<f64>,
    /// Endpoints the picker finds ready (every pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_endpoints: Option<f64>,
}

/// The first family of `names` on `page` with a finite value, its values folded by `fold`.
fn first(page: &Page, names: &[&str], fold: fn(f64, f64) -> f64) -> Option<f64> {
    names.iter().find_map(|n| {
        page.named(n)
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .reduce(fold)
    })
}

/// The picker's pool figures on `page`; `None` when it has none (not an endpoint picker).
pub fn picker_pool(page: &Page) -> Option<PickerPool> {
    let p = PickerPool {
        flow_control_queue: first(page, &QUEUE, |a, b| a + b),
        saturation: first(page, &SATURATION, f64::max),
        ready_endpoints: first(page, &READY, |a, b| a + b),
    };
    (p != PickerPool::default()).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    /// The flow control queue summed over its series, the most saturated pool, the ready
    /// endpoints; old names beside new ones read once; a page without them says nothing.
    #[test]
    fn a_pickers_pool_figures() {
        let text = "llm_d_epp_flow_control_queue_size{fairness_id=\"a\",priority=\"0\",inference_pool=\"p\",model_name=\"m\",target_model_name=\"m\"} 5\n\
                    llm_d_epp_flow_control_queue_size{fairness_id=\"b\",priority=\"1\",inference_pool=\"p\",model_name=\"m\",target_model_name=\"m\"} 2\n\
                    inference_extension_flow_control_queue_size{fairness_id=\"a\",priority=\"0\",inference_pool=\"p\",model_name=\"m\",target_model_name=\"m\"} 5\n\
                    llm_d_epp_flow_control_pool_saturation{inference_pool=\"p\"} 0.4\n\
                    llm_d_epp_flow_control_pool_saturation{inference_pool=\"q\"} 0.9\n\
                    llm_d_epp_ready_endpoints{name=\"p\"} 3\n";
        let p = picker_pool(&parse(text).expect("page")).expect("a picker page");
        assert_eq!(
            p,
            PickerPool {
                flow_control_queue: Some(7.0),
                saturation: Some(0.9),
                ready_endpoints: Some(3.0),
            }
        );
        let gie = "inference_pool_ready_pods{name=\"p\"} 2\n";
        assert_eq!(
            picker_pool(&parse(gie).expect("page")),
            Some(PickerPool {
                ready_endpoints: Some(2.0),
                ..PickerPool::default()
            })
        );
        let vllm = parse("vllm:num_requests_running{engine=\"0\"} 1\n").expect("page");
        assert_eq!(picker_pool(&vllm), None);
    }
}
