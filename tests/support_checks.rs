//! Checks of the support library itself (`support/`): its PromQL reader and its Prometheus
//! text reader. Here rather than in the library, so that the library builds no test target
//! of its own (one e2e binary to link).

mod promql {
    use lmperf_e2e::promql::{Refs, extract};

    fn names(r: &Refs) -> Vec<(&str, Vec<&str>)> {
        r.series
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.labels.iter().map(String::as_str).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn quantile_of_a_bucket_rate() {
        let r = extract(r#"histogram_quantile(0.99, sum by (le, lmperf_target) (rate(m_bucket{a=~"$t", b="", c!="x,}y"}[$__rate_interval])))"#).unwrap();
        assert_eq!(names(&r), vec![("m_bucket", vec!["a", "b", "c"])]);
        assert_eq!(r.grouping, vec!["le", "lmperf_target"]);
    }

    #[test]
    fn binary_operators_with_vector_matching() {
        let r = extract(r#"sum by (t, e) (rate(x_total{o!="ok"}[5m])) / ignoring (e) group_left sum(rate(y[${__interval}])) by (t) > bool 0.5"#).unwrap();
        assert_eq!(names(&r), vec![("x_total", vec!["o"]), ("y", vec![])]);
        assert_eq!(r.grouping, vec!["t", "e", "e", "t"]);
    }

    #[test]
    fn a_typo_in_a_function_or_a_matcher_is_an_error() {
        assert!(extract("rat(x[5m])").unwrap_err().contains("rat"));
        assert!(extract(r#"x{a=}"#).is_err());
        assert!(extract(r#"sum x"#).is_err());
    }
}

mod prom_text {
    use std::collections::BTreeSet;

    use lmperf_e2e::prom_text::{first, label_names, sum};

    const PAGE: &str = "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"2\"} 4.5\nx_total_more 100\nx 7\ny{le=\"0.5\",q=\"a,\\\"b\"} 1\n";

    #[test]
    fn sums_and_firsts_by_name_and_label_fragments() {
        assert_eq!(sum(PAGE, "x_total", &[]), 7.5);
        assert_eq!(sum(PAGE, "x_total", &["a=\"2\""]), 4.5);
        assert_eq!(sum(PAGE, "nope", &[]), 0.0);
        assert_eq!(first(PAGE, "x_total", &[]), Some(3.0));
        assert_eq!(first(PAGE, "x", &[]), Some(7.0));
        assert_eq!(first(PAGE, "x_total", &["c="]), None);
    }

    #[test]
    fn label_names_per_sample_name() {
        let n = label_names(PAGE);
        assert_eq!(
            n["x_total"],
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        assert!(n["x"].is_empty());
        assert_eq!(n["y"], BTreeSet::from(["le".to_owned(), "q".to_owned()]));
    }
}
