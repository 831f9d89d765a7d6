//! `report.html` readable at a glance (issue 18): four `lmperf run`s against scripted servers
//! (a sub-millisecond run at 500 req/s, a seconds-long run with errors and SLOs, a single
//! benchmark at concurrency 4096, a concurrency ramp), each report rendered by headless
//! Chromium: every number of the DOM that names its `summary.json` field equals that field at
//! the shown precision (three significant digits), no axis repeats a tick label, every plotted
//! point carries a `<title>`, the summary paragraph says what it should, and a screenshot is
//! kept under `target/test-artifacts/report/` for a human look (the path is printed).
//!
//! `cargo xtask ci` installs `chromium` and sets `LMPERF_REQUIRE_CHROMIUM=1`; without it these
//! tests say so and pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::chromium;
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};
use lmperf_e2e::temp;

/// Screenshot size: the whole report of these runs fits.
const SHOT: (u32, u32) = (1400, 5200);

/// A completions stream: `tokens` tokens, the first after `first`, then one every `gap`.
fn stream(first: Duration, gap: Duration, tokens: u32) -> Reply {
    let mut frames: Vec<Frame> = (0..tokens)
        .map(|i| {
            let fin = if i + 1 == tokens {
                "\"length\""
            } else {
                "null"
            };
            Frame {
                at: first + gap * i,
                bytes: format!(
                    "data: {{\"choices\":[{{\"text\":\"a\",\"finish_reason\":{fin}}}]}}\n\n"
                )
                .into_bytes(),
            }
        })
        .collect();
    frames.push(Frame {
        at: first + gap * tokens.saturating_sub(1),
        bytes: b"data: [DONE]\n\n".to_vec(),
    });
    Reply::sse(frames)
}

/// Runs `lmperf run` against a scripted server answering with `script` (completions API),
/// with `args`; returns the output directory and what it wrote on stderr.
fn run(
    name: &str,
    script: impl Fn(usize) -> Reply + Send + Sync + 'static,
    args: &[&str],
) -> (PathBuf, String) {
    let dir = temp::dir(&format!("view-{name}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(ScriptedServer::start(Arc::new(move |req, n| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        script(n)
    })));
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "m",
            "--api",
            "completions",
            "--no-ignore-eos",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .args(if args.contains(&"--warmup") {
            &[][..]
        } else {
            &["--warmup", "0"][..]
        })
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    drop(server);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    println!("{name}: lmperf run said:\n{stderr}");
    (dir, stderr.into_owned())
}

/// An element of the dumped DOM: its attributes and the text up to the next tag.
#[derive(Debug)]
struct Element {
    attrs: BTreeMap<String, String>,
    text: String,
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
}

/// Every element whose start tag holds `marker` (e.g. `data-field="`).
fn elements(dom: &str, marker: &str) -> Vec<Element> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = dom[from..].find(marker).map(|i| i + from) {
        let start = dom[..i].rfind('<').unwrap();
        let end = i + dom[i..].find('>').unwrap();
        let tag_text = &dom[start + 1..end];
        let tag_len = tag_text.split_whitespace().next().unwrap_or_default().len();
        let mut attrs = BTreeMap::new();
        let mut rest = &tag_text[tag_len..];
        while let Some(eq) = rest.find("=\"") {
            let key = rest[..eq]
                .trim()
                .rsplit(' ')
                .next()
                .unwrap_or_default()
                .to_owned();
            let after = &rest[eq + 2..];
            let close = after.find('"').unwrap();
            attrs.insert(key, unescape(&after[..close]));
            rest = &after[close + 1..];
        }
        let text_end = dom[end + 1..].find('<').map_or(dom.len(), |k| end + 1 + k);
        out.push(Element {
            attrs,
            text: unescape(&dom[end + 1..text_end]),
        });
        from = end;
    }
    out
}

/// The value of `summary.json` at `path` (`/`-separated) of benchmark `bench` (or of the
/// summary without one).
fn lookup<'a>(s: &'a serde_json::Value, bench: Option<&str>, path: &str) -> &'a serde_json::Value {
    let mut v = match bench {
        Some(name) => s["benchmarks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["benchmark"] == name)
            .unwrap_or_else(|| panic!("benchmark {name}")),
        None => s,
    };
    for key in path.split('/') {
        v = &v[key];
    }
    v
}

/// Milliseconds per shown unit (1 for units that are not times).
fn per(unit: &str) -> f64 {
    match unit {
        "µs" => 0.001,
        "s" => 1000.0,
        _ => 1.0,
    }
}

/// Checks every `data-field` element of `dom` against `summary.json` `s`: the shown number,
/// in its unit, is the field's value rounded to the shown decimals, with three significant
/// digits (0.5 % at most off); returns how many were checked and the shown texts by field.
fn check_fields(
    page: &Path,
    dom: &str,
    s: &serde_json::Value,
) -> (usize, BTreeMap<String, Vec<String>>) {
    let mut shown = BTreeMap::<String, Vec<String>>::new();
    let els = elements(dom, "data-field=\"");
    for e in &els {
        let (bench, path) = (
            e.attrs.get("data-benchmark").map(String::as_str),
            e.attrs["data-field"].as_str(),
        );
        let want = lookup(s, bench, path);
        let text = e.text.trim();
        shown
            .entry(path.to_owned())
            .or_default()
            .push(text.to_owned());
        let Some(want) = want.as_f64() else {
            assert!(
                want.is_null() && (text.is_empty() || text == "–"),
                "{}: {path} of {bench:?} is {want} but shows {text:?}",
                page.display()
            );
            continue;
        };
        let number = text.split(' ').next().unwrap().replace(',', "");
        let got: f64 = number.parse().unwrap_or_else(|_| {
            panic!(
                "{}: {path} of {bench:?} shows {text:?} ({e:?})",
                page.display()
            )
        });
        let scale = per(&e.attrs["data-unit"]);
        let decimals = number.split_once('.').map_or(0, |(_, f)| f.len()) as i32;
        let half_ulp = 0.5 * 10f64.powi(-decimals) * scale;
        let err = (got * scale - want).abs();
        assert!(
            err <= half_ulp * (1.0 + 1e-9) + 1e-12,
            "{}: {path} of {bench:?}: {text:?} ({}) is not {want} at the shown precision",
            page.display(),
            e.attrs["data-unit"]
        );
        if want != 0.0 {
            assert!(
                err / want.abs() <= 0.005 + 1e-12,
                "{}: {path} of {bench:?}: {text:?} has fewer than three significant digits of {want}",
                page.display()
            );
        }
        // The exact value is on hover.
        let exact: f64 = e.attrs["title"].parse().unwrap();
        assert!(
            (exact - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{}: title of {path}: {exact} vs {want}",
            page.display()
        );
    }
    (els.len(), shown)
}

/// Tick labels of every axis of `dom`, in page order, with the axis's scale (`log`/`linear`).
fn axes(dom: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for part in dom.split(r#"<g class="ticks "#).skip(1) {
        let scale = part
            .split("data-scale=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_owned();
        let body = &part[..part.find("</g>").unwrap()];
        let labels = body
            .split("<text")
            .skip(1)
            .map(|t| unescape(&t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()]))
            .collect();
        out.push((scale, labels));
    }
    out
}

/// What every report must satisfy; returns the DOM and the checked fields' texts.
fn check_report(
    name: &str,
    dir: &Path,
) -> Option<(String, serde_json::Value, BTreeMap<String, Vec<String>>)> {
    let Some(bin) = chromium::find() else {
        let _ = std::fs::remove_dir_all(dir);
        return None;
    };
    let page = dir.join("report.html");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let profile = dir.join("chromium-profile");
    let (dom, console) = chromium::headless(&bin, &page, &["--dump-dom"], &profile);
    assert!(
        console.is_empty(),
        "{}: console messages {console:?}",
        page.display()
    );

    let (checked, shown) = check_fields(&page, &dom, &s);
    let benches = s["benchmarks"].as_array().unwrap().len();
    // The benchmarks table (11 numbers a benchmark), the CDF tables (10 a benchmark each).
    assert!(
        checked >= benches * (11 + 3 * 10),
        "{}: {checked} numbers checked",
        page.display()
    );

    let all_axes = axes(&dom);
    assert!(
        all_axes.len() >= 2 * 6,
        "{}: {} axes",
        page.display(),
        all_axes.len()
    );
    for (scale, labels) in &all_axes {
        assert!(
            !labels.is_empty(),
            "{}: an axis without a tick",
            page.display()
        );
        let mut seen = labels.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen.len(),
            labels.len(),
            "{}: a {scale} axis repeats a tick label: {labels:?}",
            page.display()
        );
    }
    // Every drawn point has its value on hover; so has every heatmap and SLO cell.
    let circles = dom.matches("<circle").count();
    assert!(
        circles > 0
            && circles == dom.matches("</circle>").count()
            && !dom.contains("<circle /></g>"),
        "{}: circles without a title",
        page.display()
    );
    for part in dom.split("<circle").skip(1) {
        let body = &part[..part.find("</circle>").unwrap()];
        assert!(
            body.contains("<title>") && body.len() > body.find("<title>").unwrap() + 8,
            "{}: a point without its value: <circle{body}",
            page.display()
        );
    }
    // Heatmap and SLO cells: the shown number is their exact `data-value` (summary.json's
    // `length_buckets` and p99s, checked exactly by outputs.rs) at the shown precision.
    let mut cells = 0;
    for cell in elements(&dom, "data-value=\"") {
        assert!(
            cell.attrs.contains_key("title"),
            "{}: a cell without its exact value: {cell:?}",
            page.display()
        );
        let want: f64 = cell.attrs["data-value"].parse().unwrap();
        let text = cell.text.trim();
        if let Some(unit) = cell.attrs.get("data-unit") {
            let number = text.split(' ').next().unwrap().replace(',', "");
            let got: f64 = number
                .parse()
                .unwrap_or_else(|_| panic!("{}: {cell:?}", page.display()));
            let decimals = number.split_once('.').map_or(0, |(_, f)| f.len()) as i32;
            let err = (got * per(unit) - want).abs();
            assert!(
                err <= 0.5 * 10f64.powi(-decimals) * per(unit) * (1.0 + 1e-9)
                    && err <= 0.005 * want.abs() + 1e-12,
                "{}: cell shows {text:?} {unit} for {want} ms",
                page.display()
            );
            cells += 1;
        }
    }
    println!("{name}: {cells} heatmap and SLO cells show their value at three significant digits");
    // A data table under each plot.
    assert_eq!(
        dom.matches("<figure class=\"chart\">").count(),
        dom.matches("<details><summary>Data</summary>").count()
            + dom.matches("<p>no data</p>").count()
    );
    let overview = &dom[dom
        .find(r#"<p id="overview">"#)
        .expect("the summary paragraph")..];
    let overview = &overview[..overview.find("</p>").unwrap()];
    assert!(
        overview.contains(&format!("{benches} benchmark")),
        "{overview}"
    );

    // The picture, kept for a human look.
    let artifacts = workspace_root().join("target/test-artifacts/report");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&shot);
    let (_, console) = chromium::headless(
        &bin,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={},{}", SHOT.0, SHOT.1),
        ],
        &profile,
    );
    assert!(
        console.is_empty(),
        "{}: console messages {console:?}",
        page.display()
    );
    let drawn = drawn_share(&shot);
    assert!(
        drawn > 0.02,
        "{}: only {:.2} % of the pixels drawn",
        shot.display(),
        drawn * 100.0
    );
    let _ = std::fs::copy(&page, artifacts.join(format!("{name}.html")));
    let _ = std::fs::remove_dir_all(dir);
    println!(
        "{name}: {checked} numbers match summary.json, {} axes without a repeated tick; screenshot {} ({:.1} % drawn)",
        all_axes.len(),
        shot.display(),
        drawn * 100.0
    );
    Some((dom, s, shown))
}

/// Share of the screenshot's pixels that are not white, and its size is the asked one.
fn drawn_share(path: &Path) -> f64 {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), SHOT, "{}", path.display());
    let ch = info.color_type.samples();
    let px = buf[..info.buffer_size()].chunks(ch);
    let n = px.len();
    px.filter(|p| p[..3].iter().any(|&c| c < 245)).count() as f64 / n as f64
}

/// The plot `title`'s part of the DOM (its figure).
fn figure<'a>(dom: &'a str, title: &str) -> &'a str {
    let at = dom
        .find(&format!("<figcaption>{title}</figcaption>"))
        .unwrap_or_else(|| panic!("no plot {title:?}"));
    &dom[at..at + dom[at..].find("</figure>").unwrap()]
}

/// The issue's run: 500 req/s against a server answering in microseconds. Times show three
/// significant digits of a millisecond (not `0.2`, `0.0`), and the TPOT CDF is drawn on its
/// own scale (ticks differ, so it is not squeezed at 0).
#[test]
fn sub_millisecond_run() {
    let (dir, stderr) = run(
        "submillisecond",
        |_| stream(Duration::ZERO, Duration::from_micros(30), 4),
        &[
            "--batch-sizes",
            "1",
            "8",
            "--seq-lengths",
            "16",
            "--num-prompts",
            "300",
            "--request-rate",
            "500",
            "--output-len",
            "4",
            "--goodput",
            "ttft:1",
        ],
    );
    let Some((dom, s, shown)) = check_report("submillisecond", &dir) else {
        return;
    };
    // Tokens 30 µs apart: TPOT and ITL are sub-millisecond (TTFT too, on an idle machine).
    for b in s["benchmarks"].as_array().unwrap() {
        assert!(
            b["tpot_ms"]["p50"].as_f64().unwrap() < 1.0,
            "a sub-millisecond server: {}",
            b["tpot_ms"]
        );
    }
    for t in shown["ttft_ms/p50"]
        .iter()
        .chain(&shown["tpot_ms/p50"])
        .chain(&shown["itl_ms/p50"])
    {
        let digits = t
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .trim_start_matches(['0', '.'])
            .len();
        assert!(digits >= 3, "shown as {t:?}: three significant digits");
    }
    // The terminal summary: the same formatter, a unit per value.
    for b in s["benchmarks"].as_array().unwrap() {
        let name = b["benchmark"].as_str().unwrap();
        let line = stderr
            .lines()
            // The benchmark's summary line, not a progress line ("… done, … errors") of a
            // benchmark that ran past the 2 s progress interval.
            .find(|l| l.starts_with(&format!("lmperf run: {name}: ")) && l.contains("TTFT p50 "))
            .unwrap_or_else(|| panic!("no summary line of {name}: {stderr}"));
        let after = &line[line.find("TTFT p50 ").unwrap() + 9..];
        let mut words = after.split(' ');
        let (number, unit) = (words.next().unwrap(), words.next().unwrap());
        let (got, want) = (
            number.replace(',', "").parse::<f64>().unwrap() * per(unit),
            b["ttft_ms"]["p50"].as_f64().unwrap(),
        );
        assert!(
            ["µs", "ms", "s"].contains(&unit) && (got - want).abs() <= 0.005 * want,
            "{line}: TTFT p50 {want} ms"
        );
    }
    let tpot = figure(&dom, "TPOT CDF");
    let ticks = &axes(tpot)[0].1;
    assert!(ticks.len() >= 3, "TPOT axis {ticks:?}");
    assert!(
        dom.contains("Fastest: <b>") && dom.contains("slowest: <b>"),
        "fastest and slowest named"
    );
    assert!(dom.contains(r#"class="slo-verdict""#));
}

/// Seconds-long latencies with errors and SLOs: times in seconds where they are, a log axis
/// where they span more than two decades, errors and SLO verdicts in the paragraph.
#[test]
fn seconds_long_run() {
    let script = |n: usize| {
        if n % 7 == 3 {
            return Reply::json(500, r#"{"error":{"message":"overloaded"}}"#);
        }
        // Most requests answer in 4 ms, one in four after 1.2 s: TTFT spans 2.5 decades.
        let first = if n % 4 == 1 {
            Duration::from_millis(1200)
        } else {
            Duration::from_millis(4)
        };
        stream(first, Duration::from_millis(120), 3)
    };
    let (dir, _) = run(
        "seconds",
        script,
        &[
            "--batch-sizes",
            "2",
            "4",
            "--seq-lengths",
            "16",
            "--num-prompts",
            "16",
            "--output-len",
            "3",
            "--goodput",
            "ttft:500",
            "e2el:1000",
            "--warmup",
            "2",
        ],
    );
    let Some((dom, s, shown)) = check_report("seconds", &dir) else {
        return;
    };
    // The warm-ups: counted in summary.json, marked before each benchmark on the time axis.
    for b in s["benchmarks"].as_array().unwrap() {
        assert_eq!(b["warmup_requests"], 2, "{b}");
        assert!(b["warmup_s"].as_f64().is_some_and(|w| w > 0.0), "{b}");
    }
    assert_eq!(
        figure(&dom, "TTFT over time")
            .matches("warm-up (not measured): ")
            .count(),
        2,
        "one warm-up band (its title) per benchmark"
    );
    let failed: u64 = s["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["num_requests"].as_u64().unwrap() - b["completed"].as_u64().unwrap())
        .sum();
    assert!(failed > 0);
    let overview = &dom[dom.find(r#"<p id="overview">"#).unwrap()..];
    assert!(
        overview[..overview.find("</p>").unwrap()].contains(&format!("{failed} failed")),
        "errors in the paragraph"
    );
    assert_eq!(
        overview[..overview.find("</p>").unwrap()]
            .matches(r#"class="slo-verdict" data-pass="false""#)
            .count(),
        2,
        "both SLOs missed (p99 of 1.2 s)"
    );
    assert!(
        shown["e2el_ms/p99"].iter().all(|t| !t.is_empty()),
        "{shown:?}"
    );
    assert!(
        dom.contains(r#"data-field="e2el_ms/p99" data-unit="s""#),
        "E2EL p99 over a second is shown in seconds"
    );
    let ttft = figure(&dom, "TTFT CDF");
    assert!(
        ttft.contains(r#"<g class="ticks x" data-scale="log""#),
        "4 ms to 1.2 s: a log axis"
    );
    assert!(figure(&dom, "TTFT over time").contains("rolling p50"));
}

/// One benchmark at concurrency 4096 (the issue's axis of 4096, 4096, 4097): its throughput
/// is one point, drawn with its value, on an axis with the one tick `4,096`.
#[test]
fn single_benchmark() {
    let (dir, _) = run(
        "single",
        |_| stream(Duration::from_millis(2), Duration::from_millis(1), 4),
        &[
            "--batch-sizes",
            "4096",
            "--seq-lengths",
            "16",
            "--num-prompts",
            "64",
            "--output-len",
            "4",
        ],
    );
    let Some((dom, s, _)) = check_report("single", &dir) else {
        return;
    };
    let thr = figure(&dom, "Output tokens/s vs concurrency");
    let axes = axes(thr);
    assert_eq!(axes[0].1, ["4,096"], "x axis");
    let value = s["benchmarks"][0]["output_token_throughput"]
        .as_f64()
        .unwrap();
    let label = &thr[thr
        .find(r#"class="point-value""#)
        .expect("the point's value")..];
    let label = &label[label.find('>').unwrap() + 1..label.find("</text>").unwrap()];
    let got: f64 = label
        .split(' ')
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert!(
        (got - value).abs() / value < 0.005,
        "point label {label:?} vs {value}"
    );
    assert!(
        dom.contains("<b>c4096_in16</b>: TTFT p50"),
        "the paragraph of one benchmark"
    );
}

/// A concurrency ramp 1 → 6: the time plots mark its steps (c=1 … c=6) as phases.
#[test]
fn concurrency_ramp() {
    let (dir, _) = run(
        "ramp",
        |_| stream(Duration::from_millis(8), Duration::from_millis(3), 3),
        &[
            "--seq-lengths",
            "8",
            "--num-prompts",
            "2000",
            "--output-len",
            "3",
            "--duration",
            "2s",
            "--ramp",
            "linear",
            "--ramp-over",
            "concurrency",
            "--ramp-from",
            "1",
            "--ramp-to",
            "6",
            "--ramp-duration",
            "1500ms",
        ],
    );
    let Some((dom, _, _)) = check_report("ramp", &dir) else {
        return;
    };
    let over_time = figure(&dom, "TTFT over time");
    let steps: std::collections::BTreeSet<&str> = over_time
        .split("<title>c=")
        .skip(1)
        .map(|t| &t[..t.find(':').unwrap()])
        .collect();
    assert!(
        steps.len() >= 5 && steps.contains("1") && steps.contains("6"),
        "ramp steps marked: {steps:?}"
    );
    assert!(dom.contains("Latency vs concurrency (ramp)"));
}
