//! The native `Metrics`: a core [`Metrics`] handle that metered connectors
//! count their transfers into (`Connector(metrics=...)` wraps the backend in
//! [`Metered`](descriptor_core::metrics::Metered)), read back as OpenMetrics
//! text or as families of samples.
//!
//! The families are parsed here from the text the core encodes, so that the
//! Python side (`Metrics.samples()`, the `prometheus_client` collector) sees
//! exactly what a scrape of the text would: one source for names, labels
//! and values, those of `descriptor_core::metrics`' module docs.

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::metrics::{Metered, Metrics};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Transfer metrics shared by the connectors made with them.
#[pyclass(frozen, module = "nixl_connect._native", name = "Metrics")]
pub(crate) struct PyMetrics {
    inner: Metrics,
}

impl PyMetrics {
    pub(crate) fn inner(&self) -> &Metrics {
        &self.inner
    }
}

/// One sample: its name (with the family's suffix: `_total`, `_bucket`,
/// `_sum`, `_count`), its labels in the text's order, its value.
type Sample = (String, Vec<(String, String)>, f64);

/// One metric family of the text: name, type, unit (empty if none), help,
/// samples.
#[derive(Default)]
struct Family {
    name: String,
    kind: String,
    unit: String,
    help: String,
    samples: Vec<Sample>,
}

/// The families of OpenMetrics `text`, in its order. Lines that do not parse
/// are skipped: the text is the core's own encoding, whose label values are
/// fixed words, so none should be; a sample before any `# TYPE` line gets a
/// family of its own name and type `unknown`.
fn families(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (Some(keyword), Some(name)) = (parts.next(), parts.next()) else {
                continue;
            };
            let rest = parts.next().unwrap_or("");
            if out.last().is_none_or(|f| f.name != name) {
                out.push(Family {
                    name: name.to_owned(),
                    kind: "unknown".to_owned(),
                    ..Family::default()
                });
            }
            let Some(family) = out.last_mut() else {
                continue;
            };
            match keyword {
                "HELP" => family.help = unescape(rest),
                "TYPE" => rest.clone_into(&mut family.kind),
                "UNIT" => rest.clone_into(&mut family.unit),
                _ => {}
            }
        } else if let Some(sample) = sample(line) {
            let owned = out
                .last()
                .is_some_and(|f| sample.0.starts_with(f.name.as_str()));
            if !owned {
                out.push(Family {
                    name: sample.0.clone(),
                    kind: "unknown".to_owned(),
                    ..Family::default()
                });
            }
            if let Some(family) = out.last_mut() {
                family.samples.push(sample);
            }
        }
    }
    out
}

/// `name{a="x",b="y"} value` (or `name value`); a timestamp or exemplar
/// after the value is ignored.
fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = label_set(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.to_owned(), labels, value))
}

/// The labels of `text` (what follows a sample name's `{`) up to the closing
/// `}`, with what follows it.
fn label_set(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = text.split_once("=\"")?;
        // The value runs to the first quote not escaped by a backslash.
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (at, '"') => break at,
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim().to_owned(), value));
        text = &after[end + 1..];
    }
}

/// A `# HELP` text with its escapes (`\\`, `\n`, `\"`) undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// A sample as Python sees it: `(name, {label: value}, value)`, the labels
/// in the text's order.
fn sample_to_py<'py>(
    py: Python<'py>,
    (name, labels, value): Sample,
) -> PyResult<(String, Bound<'py, PyDict>, f64)> {
    let dict = PyDict::new(py);
    for (key, value) in labels {
        dict.set_item(key, value)?;
    }
    Ok((name, dict, value))
}

/// What `families` returns for one family.
type PyFamily<'py> = (
    String,
    String,
    String,
    String,
    Vec<(String, Bound<'py, PyDict>, f64)>,
);

#[pymethods]
impl PyMetrics {
    /// Metrics that no connector counts into yet; a connector made with
    /// them adds its backend's series, at zero.
    #[new]
    fn new() -> PyMetrics {
        PyMetrics {
            inner: Metrics::new(),
        }
    }

    /// Every metric as OpenMetrics text, ending in `# EOF`
    /// (`Metrics::encode_text`).
    fn encode_text(&self, py: Python<'_>) -> String {
        crate::exit::detach(py, || self.inner.encode_text())
    }

    /// Every metric family of `encode_text`, in its order: `(name, type,
    /// unit, help, samples)`, `unit` empty if none, each sample
    /// `(name, labels, value)` as in the text (a counter's ends in
    /// `_total`; a histogram's are its cumulative `_bucket`s, labelled `le`,
    /// then its `_sum` and `_count`).
    fn families<'py>(&self, py: Python<'py>) -> PyResult<Vec<PyFamily<'py>>> {
        let text = crate::exit::detach(py, || self.inner.encode_text());
        families(&text)
            .into_iter()
            .map(|f| {
                let samples = f
                    .samples
                    .into_iter()
                    .map(|s| sample_to_py(py, s))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok((f.name, f.kind, f.unit, f.help, samples))
            })
            .collect()
    }

    /// The families a metered backend adds, as `families` has them but
    /// with no samples: what `prometheus_client` checks for duplicates when
    /// a collector is registered, before any connector exists. Read from a
    /// metered loopback backend on a fabric of its own, so that the names
    /// are the core's; a family with no series until something happens
    /// (failures, by reason) is not among them.
    #[staticmethod]
    fn described(py: Python<'_>) -> PyResult<Vec<PyFamily<'_>>> {
        let text = crate::exit::detach(py, || {
            let metrics = Metrics::new();
            let backend = LoopbackBackend::new(&Fabric::new(), "described")?;
            let metered = Metered::new(backend, &metrics);
            let text = metrics.encode_text();
            drop(metered);
            Ok(text)
        })
        .map_err(crate::error::to_py)?;
        Ok(families(&text)
            .into_iter()
            .map(|f| (f.name, f.kind, f.unit, f.help, Vec::new()))
            .collect())
    }

    fn __repr__(&self) -> &'static str {
        "Metrics()"
    }
}
