//! The episode format, the AC@k arithmetic, and a short subset of the corpus through the engine
//! (the whole corpus: `cargo xtask diagnose-eval`).

use super::episode::{Episode, EpisodeError, FORMAT, Outcome, replay};
use super::eval::{report, table};
use super::synth::{self, Control, Magnitude};
use crate::diagnosis::{Cause, EngineConfig};

#[test]
fn an_episode_survives_its_file_and_bad_files_name_the_field() {
    let ep = synth::fault(Cause::Network, Magnitude::Mild, 1);
    let text = serde_json::to_string(&ep).unwrap();
    let back = Episode::parse(&text, "x.json").unwrap();
    assert_eq!(back, ep);
    assert_eq!(
        back.onset_unix_s(),
        Some(synth::START_UNIX_S + synth::CALM_S)
    );
    // The signals carry their stable names.
    let s = &back.series[synth::TARGET];
    assert!(
        s.contains_key("net_srtt") && s.contains_key("error_5xx"),
        "{:?}",
        s.keys()
    );

    let bad = text.replacen(FORMAT, "lmperf-episode/9", 1);
    let e = Episode::parse(&bad, "x.json").unwrap_err();
    assert!(matches!(e, EpisodeError::Format { .. }));
    assert_eq!(
        e.to_string(),
        "x.json: format = \"lmperf-episode/9\": expected \"lmperf-episode/1\""
    );
    let bad = text.replacen("\"net_srtt\"", "\"net_rtt\"", 1);
    assert_eq!(
        Episode::parse(&bad, "x.json").unwrap_err().to_string(),
        "x.json: series.vllm-0.net_rtt: not a signal name (see diagnosis::Signal)"
    );
    let bad = text.replacen("\"target\":\"vllm-0\"", "\"target\":\"vllm-9\"", 1);
    assert_eq!(
        Episode::parse(&bad, "x.json").unwrap_err().to_string(),
        "x.json: target = \"vllm-9\": no series for it"
    );
}

fn outcome(name: &str, cause: Option<Cause>, ranking: &[Cause], ttd: Option<f64>) -> Outcome {
    Outcome {
        name: name.to_owned(),
        cause,
        magnitude: None,
        ranking: ranking.to_vec(),
        time_to_confirmed_s: ttd,
        confirmed_evaluations: usize::from(ttd.is_some()),
        triggered_evaluations: usize::from(!ranking.is_empty()),
        first_confirmed: None,
    }
}

#[test]
fn ac_at_k_counts_the_rank_of_the_injected_cause() {
    use Cause::*;
    let outs = vec![
        outcome("a", Some(Network), &[Network, ErrorBurst], Some(20.0)),
        outcome(
            "b",
            Some(Network),
            &[ErrorBurst, LoadSurge, Network],
            Some(40.0),
        ),
        outcome("c", Some(Network), &[], None),
        outcome(
            "d",
            Some(LoadSurge),
            &[ServerQueueing, LoadSurge],
            Some(10.0),
        ),
        outcome("e", None, &[], None),
        outcome("f", None, &[Unknown], Some(5.0)),
    ];
    let r = report(&outs);
    let net = r.rows.iter().find(|x| x.cause == Some(Network)).unwrap();
    assert_eq!((net.episodes, net.confirmed), (3, 2));
    assert!((net.ac1 - 1.0 / 3.0).abs() < 1e-12);
    assert!((net.ac3 - 2.0 / 3.0).abs() < 1e-12);
    // Avg@5 = (1/3 + 1/3 + 2/3 + 2/3 + 2/3) / 5.
    assert!((net.avg5 - 8.0 / 15.0).abs() < 1e-12);
    assert_eq!(net.median_time_to_confirmed_s, Some(30.0));
    assert_eq!(r.total.episodes, 4);
    assert!((r.total.ac1 - 0.25).abs() < 1e-12);
    assert!((r.total.ac3 - 0.75).abs() < 1e-12);
    assert_eq!(r.total.median_time_to_confirmed_s, Some(20.0));
    assert_eq!(
        (r.controls, r.control_diagnoses, r.control_triggered),
        (2, 1, 1)
    );
    let t = table(&r);
    assert!(
        t.contains("network                     3   0.33   0.67"),
        "{t}"
    );
    assert!(t.contains("controls: 2 episodes, 1 diagnosed"), "{t}");
    assert!(t.contains("  c → nothing"), "{t}");
}

/// A short subset: one episode per latency part (TTFT: network; both: load; errors: a GPU
/// fault) and a calm control; the engine must name each cause first within 60 s and stay idle
/// in the control.
#[test]
fn the_engine_names_the_injected_cause_on_a_corpus_subset() {
    let cfg = EngineConfig::default();
    for (cause, m) in [
        (Cause::Network, Magnitude::Strong),
        (Cause::LoadSurge, Magnitude::Strong),
        (Cause::GpuFault, Magnitude::Mild),
    ] {
        let o = replay(&synth::fault(cause, m, 1), cfg);
        assert_eq!(o.rank(), Some(1), "{o:?}");
        let ttd = o.time_to_confirmed_s.unwrap_or(f64::INFINITY);
        assert!((0.0..=60.0).contains(&ttd), "{o:?}");
    }
    let o = replay(&synth::control(Control::Calm, 1), cfg);
    assert_eq!(
        (o.triggered_evaluations, o.confirmed_evaluations),
        (0, 0),
        "{o:?}"
    );
}
