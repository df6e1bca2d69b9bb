//! The field corpus (tests/fixtures/field/*.tsv): real lines users posted in public reports,
//! each labelled with the failure it is (or `none`: a trap that must stay quiet, or `context`:
//! not decidable from the line alone). Every line goes through the path `check --since` takes,
//! twice: as a CRI log line under a kubelet-style pod log tree and as a Docker json-file entry,
//! read back by the tailer and recognised (`failures::sources::recognised_since`). Measured as a
//! classifier: recall per kind and false positives; run with --nocapture for the table.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use shmlink::failures::correlate::rfc3339;
use shmlink::failures::sources::recognised_since;
use shmlink::failures::Sources;
use shmlink::model::DeathRules;
use shmlink::model::Who;

struct Excerpt {
    label: String,
    program: String,
    line: String,
    url: String,
}

fn corpus() -> Vec<Excerpt> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/field");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tsv"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        for (n, row) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
            if row.starts_with('#') || row.trim().is_empty() {
                continue;
            }
            let cols: Vec<&str> = row.split('\t').collect();
            assert_eq!(cols.len(), 4, "{}:{}: {row}", file.display(), n + 1);
            out.push(Excerpt {
                label: cols[0].into(),
                program: cols[1].into(),
                line: cols[2].into(),
                url: cols[3].into(),
            });
        }
    }
    out
}

/// What was told of each excerpt, by its index: the kinds of the failures told (not the
/// workers' words, which are never told alone), and whether each is told only with a full
/// /dev/shm (`judged`: a line that names a fault, not its cause).
fn told(excerpts: &[Excerpt], docker: bool) -> Vec<Vec<(String, bool)>> {
    let tmp = tempfile::tempdir().unwrap();
    let pods = tmp.path().join("pods");
    let root = tmp.path().join("docker");
    let at = rfc3339(SystemTime::now());
    for (i, e) in excerpts.iter().enumerate() {
        if docker {
            let id = format!("{i:064x}");
            let dir = root.join("containers").join(&id);
            std::fs::create_dir_all(&dir).unwrap();
            let entry = serde_json::json!({"log": format!("{}\n", e.line), "stream": "stderr",
                "time": at});
            let mut f = std::fs::File::create(dir.join(format!("{id}-json.log"))).unwrap();
            writeln!(f, "{entry}").unwrap();
        } else {
            let dir = pods.join(format!(
                "field_corpus-{i}_{i:08x}-0000-4000-8000-000000000000/c"
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let mut f = std::fs::File::create(dir.join("0.log")).unwrap();
            writeln!(f, "{at} stderr F {}", e.line).unwrap();
        }
    }
    let sources = Sources {
        pod_log_root: (!docker).then(|| pods.clone()),
        docker_root: docker.then(|| root.clone()),
        kmsg: None,
        proc_root: "/nonexistent".into(),
        host_mnt: None,
        rules: DeathRules::default(),
    };
    let mut out = vec![Vec::new(); excerpts.len()];
    for d in recognised_since(&sources, SystemTime::now() - Duration::from_secs(3600)) {
        if !d.worker_pids.is_empty() {
            continue;
        }
        let i: usize = match &d.who {
            Who::Pod { pod, .. } => pod.strip_prefix("corpus-").unwrap().parse().unwrap(),
            Who::Container { container_id, .. } | Who::Docker { container_id, .. } => {
                usize::from_str_radix(container_id, 16).unwrap()
            }
            other => panic!("{other:?}"),
        };
        out[i].push((d.kind.as_str().to_string(), d.judged));
    }
    out
}

#[derive(Default)]
struct Tally {
    lines: usize,
    hit: usize,
    /// Told as another kind than the label: a wrong blame.
    wrong: usize,
}

#[test]
fn the_field_corpus_is_told_as_labelled() {
    let excerpts = corpus();
    let programs: std::collections::BTreeSet<_> = excerpts
        .iter()
        .map(|e| e.program.split([' ', '(']).next().unwrap().to_lowercase())
        .collect();
    let traps = excerpts.iter().filter(|e| e.label == "none").count();
    println!(
        "{} excerpts, {} traps, {} programs: {programs:?}",
        excerpts.len(),
        traps,
        programs.len()
    );
    assert!(excerpts.len() >= 150 && programs.len() >= 10 && traps * 3 >= excerpts.len());

    let mut failures = Vec::new();
    for docker in [false, true] {
        let told = told(&excerpts, docker);
        let mut by_kind: BTreeMap<&str, Tally> = BTreeMap::new();
        let mut false_positives = Vec::new();
        let mut context = (0, 0);
        let mut judged = 0;
        for (e, told) in excerpts.iter().zip(&told) {
            // A judged match is told only with a full /dev/shm (correlate decides, tested
            // there): it counts as told on no line here, and on a trap it is a false positive.
            let kinds: Vec<&str> = told
                .iter()
                .filter(|(_, j)| !j || e.label == "none")
                .map(|(k, _)| k.as_str())
                .collect();
            if e.label == "context" && told.iter().any(|(_, j)| *j) {
                judged += 1;
            }
            match e.label.as_str() {
                "none" => {
                    if !kinds.is_empty() {
                        false_positives.push(format!("{kinds:?} <- {} ({})", e.line, e.url));
                    }
                }
                "context" => {
                    context.0 += 1;
                    if !kinds.is_empty() {
                        context.1 += 1;
                        println!(
                            "  context line told alone as {kinds:?}: {} ({})",
                            e.line, e.url
                        );
                    }
                }
                label => {
                    let t = by_kind.entry(label).or_default();
                    t.lines += 1;
                    if kinds.contains(&label) {
                        t.hit += 1;
                    } else {
                        if !kinds.is_empty() {
                            t.wrong += 1;
                            false_positives.push(format!(
                                "{kinds:?}, labelled {label} <- {} ({})",
                                e.line, e.url
                            ));
                        }
                        println!("  missed ({label}): {} ({})", e.line, e.url);
                    }
                }
            }
        }
        let (lines, hit) = by_kind
            .values()
            .fold((0, 0), |(l, h), t| (l + t.lines, h + t.hit));
        println!(
            "\n{} | kind | lines | told | recall | wrong kind |\n|---|---:|---:|---:|---:|",
            if docker { "Docker json-file" } else { "CRI" }
        );
        for (kind, t) in &by_kind {
            println!(
                "| {kind} | {} | {} | {:.1}% | {} |",
                t.lines,
                t.hit,
                100.0 * t.hit as f64 / t.lines as f64,
                t.wrong
            );
        }
        let recall = hit as f64 / lines as f64;
        println!(
            "| all | {lines} | {hit} | {:.1}% | |\ntraps: {traps}, false positives: {}; \
             context-only lines: {}, told alone: {}, told only with /dev/shm full: {judged}",
            100.0 * recall,
            false_positives.len(),
            context.0,
            context.1
        );
        // The fault lines with no cause of their own (a shell's bus error, Chromium's out of
        // memory) are in the corpus: each must reach the state judgement, not be dropped.
        assert!(judged > 0, "no context line was judged by /dev/shm's state");
        for fp in &false_positives {
            println!("  FALSE POSITIVE: {fp}");
        }
        if !false_positives.is_empty() || recall < 0.95 {
            failures.push(format!(
                "{}: recall {:.1}%, {} false positives",
                if docker { "docker" } else { "cri" },
                100.0 * recall,
                false_positives.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Blocks of lines of one container (tests/fixtures/field/context.txt): what the window of its
/// recent lines decides, through the same path.
#[test]
fn lines_that_decide_each_other_are_told_once_with_the_deciding_line() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/field/context.txt"),
    )
    .unwrap();
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        match line.strip_prefix("== ") {
            Some(head) => blocks.push((head.split(' ').next().unwrap().into(), Vec::new())),
            None => blocks.last_mut().unwrap().1.push(line.into()),
        }
    }
    assert!(!blocks.is_empty());
    let tmp = tempfile::tempdir().unwrap();
    let pods = tmp.path().join("pods");
    let at = rfc3339(SystemTime::now());
    for (i, (_, lines)) in blocks.iter().enumerate() {
        let dir = pods.join(format!(
            "field_corpus-{i}_{i:08x}-0000-4000-8000-000000000000/c"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = std::fs::File::create(dir.join("0.log")).unwrap();
        for l in lines {
            writeln!(f, "{at} stderr F {l}").unwrap();
        }
    }
    let sources = Sources {
        pod_log_root: Some(pods),
        docker_root: None,
        kmsg: None,
        proc_root: "/nonexistent".into(),
        host_mnt: None,
        rules: DeathRules::default(),
    };
    let mut told: Vec<Vec<(String, String)>> = vec![Vec::new(); blocks.len()];
    for d in recognised_since(&sources, SystemTime::now() - Duration::from_secs(3600)) {
        let Who::Pod { pod, .. } = &d.who else {
            panic!("{d:?}")
        };
        let i: usize = pod.strip_prefix("corpus-").unwrap().parse().unwrap();
        told[i].push((d.kind.as_str().to_string(), d.evidence.clone()));
    }
    for ((want, lines), told) in blocks.iter().zip(&told) {
        let kinds: Vec<&str> = told.iter().map(|(k, _)| k.as_str()).collect();
        let want: Vec<&str> = want.split(',').filter(|k| *k != "none").collect();
        assert_eq!(kinds, want, "{lines:#?}");
        for (_, evidence) in told {
            assert!(
                evidence.contains("(after: ") && evidence.contains("SemLock("),
                "the line that decided is told: {evidence}"
            );
        }
    }
}
