//! Prometheus text exposition, parsed for the Rust harnesses: the tests' scraper
//! (`agent::sample`) and the benchmarks under bench/ include it. tests/common/promtext.py is the
//! same parser for the Python ones; tests/it/promtext.rs tests both.

#![allow(dead_code)] // each including crate uses a different part

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// In the line's order, values unescaped.
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether every pair of `labels` is among this sample's labels.
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// Every sample of `text`, in order. A line that is not a sample (comments, blank lines,
/// anything else) is skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// The value of the first series of `metric` whose labels include every pair of `labels`.
pub fn value(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text)
        .find(|s| s.name == metric && s.has_labels(labels))
        .map(|s| s.value)
}

/// One line as a sample, or None when it is not one.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.starts_with('#') {
        return None;
    }
    let name_len = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_len];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut rest = &line[name_len..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after.trim_start();
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once('=')?;
            let key = key.trim();
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            let (value, after) = quoted(after.trim_start())?;
            labels.push((key, value));
            rest = after.trim_start();
            // A comma before the closing brace is allowed.
            if let Some(after) = rest.strip_prefix(',') {
                rest = after.trim_start();
            } else if !rest.starts_with('}') {
                return None;
            }
        }
    }
    // The value, then an optional timestamp.
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next()?)?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `"..."` at the start of `s`: the unescaped value and what follows the closing quote.
fn quoted(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &body[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// Go's ParseFloat as Prometheus writes values: also `+Inf`, `-Inf`, `NaN`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}
