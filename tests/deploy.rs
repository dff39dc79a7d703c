//! What an operator installs beside the binary names only what the binary
//! exports: every metric in the alert rules (deploy/prometheus/alerts.yml)
//! and the Grafana dashboard (deploy/grafana/kvtarget.json) is a family of
//! `kvtarget::metrics` (or one of its histogram's series), and every query
//! names at least one. ci/alerts.sh checks the same queries' syntax with
//! promtool and runs the alert rules' unit tests.

use std::collections::BTreeMap;

/// Series that are not kvtarget's but that rules may name: Prometheus' own
/// scrape health and the blackbox exporter's probe of a listener.
const EXTERNAL: &[&str] = &["up", "probe_success"];

fn root(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Exported series names: each family, and a histogram's _bucket, _sum and
/// _count.
fn exported() -> BTreeMap<String, &'static str> {
    let mut m = BTreeMap::new();
    for (name, kind) in kvtarget::metrics::families() {
        if kind == "histogram" {
            for s in ["_bucket", "_sum", "_count"] {
                m.insert(format!("{name}{s}"), kind);
            }
        } else {
            m.insert(name.to_string(), kind);
        }
    }
    m
}

/// The metric names in a PromQL expression: identifiers starting with
/// `kvtarget_`, and the external ones used as a selector.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.char_indices().peekable();
    let mut in_quotes = false;
    while let Some((i, c)) = chars.next() {
        if c == '"' {
            in_quotes = !in_quotes;
            continue;
        }
        if in_quotes || !(c.is_ascii_alphabetic() || c == '_') {
            continue;
        }
        // An identifier starts only after a non-identifier character.
        if i > 0
            && expr[..i]
                .chars()
                .last()
                .is_some_and(|p| p.is_ascii_alphanumeric() || p == '_' || p == ':')
        {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                end = j + d.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        let ident = &expr[i..end];
        let rest = expr[end..].trim_start();
        let external_selector = EXTERNAL.contains(&ident)
            && (rest.starts_with('{') || rest.starts_with("==") || rest.is_empty());
        if ident.starts_with("kvtarget_") || external_selector {
            names.push(ident.to_string());
        }
    }
    names
}

fn check(what: &str, expr: &str, exported: &BTreeMap<String, &str>, problems: &mut Vec<String>) {
    let names = metric_names(expr);
    if names.is_empty() {
        problems.push(format!("{what}: `{expr}` names no kvtarget metric"));
    }
    for n in names {
        if !exported.contains_key(&n) && !EXTERNAL.contains(&n.as_str()) {
            problems.push(format!("{what}: `{n}` is not a metric kvtarget exports"));
        }
    }
}

/// Every `expr` string anywhere in a Grafana dashboard, and the template
/// variables' queries, with where each is.
fn dashboard_queries(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                let here = format!("{path}.{k}");
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(e)) => {
                        out.push((here, e.clone()))
                    }
                    _ => dashboard_queries(x, &here, out),
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                dashboard_queries(x, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn dashboard_queries_name_exported_metrics() {
    let exported = exported();
    let text = std::fs::read_to_string(root("deploy/grafana/kvtarget.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    dashboard_queries(&dash, "", &mut queries);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    let mut problems = Vec::new();
    for (at, q) in &queries {
        check(at, q, &exported, &mut problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The issue's panels are all there.
    for must in [
        "kvtarget_volume_ops_total",
        "kvtarget_volume_bytes_total",
        "histogram_quantile(0.99,",
        "histogram_quantile(0.999,",
        "kvtarget_reactor_busy_seconds_total",
        "kvtarget_reactor_stalls_total",
        "kvtarget_pool_used_bytes",
        "kvtarget_gc_backlog_extents",
        "kvtarget_kv_hits_total",
        "kvtarget_kv_misses_total",
        "kvtarget_kv_evictions_total",
        "kvtarget_cluster_ana_group_role",
    ] {
        assert!(
            queries.iter().any(|(_, q)| q.contains(must)),
            "no panel uses {must}"
        );
    }
}

#[test]
fn alert_rules_name_exported_metrics() {
    let exported = exported();
    let text = std::fs::read_to_string(root("deploy/prometheus/alerts.yml")).unwrap();
    let mut problems = Vec::new();
    let mut rules = 0;
    for (n, line) in text.lines().enumerate() {
        let l = line.trim_start();
        if let Some(expr) = l.strip_prefix("expr:") {
            let expr = expr.trim();
            // One line per expression keeps this check honest.
            assert!(
                !expr.is_empty() && !expr.starts_with('|') && !expr.starts_with('>'),
                "alerts.yml:{}: multi-line expr",
                n + 1
            );
            check(
                &format!("alerts.yml:{}", n + 1),
                expr,
                &exported,
                &mut problems,
            );
            rules += 1;
        }
    }
    assert!(rules >= 20, "{rules} rules");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_name_check_sees_what_it_must() {
    let exported = exported();
    let mut problems = Vec::new();
    check(
        "t",
        r#"rate(kvtarget_volume_ops_totl{op="read"}[5m])"#,
        &exported,
        &mut problems,
    );
    check(
        "t",
        r#"sum(rate(kvtarget_qpair_latency_seconds_bucket[5m]))"#,
        &exported,
        &mut problems,
    );
    check(
        "t",
        r#"label_replace(vector(1), "a", "kvtarget_x", "", "")"#,
        &exported,
        &mut problems,
    );
    check("t", r#"up{job="kvtarget"} == 0"#, &exported, &mut problems);
    assert_eq!(
        problems,
        [
            "t: `kvtarget_volume_ops_totl` is not a metric kvtarget exports",
            "t: `label_replace(vector(1), \"a\", \"kvtarget_x\", \"\", \"\")` names no kvtarget metric",
        ]
    );
}
