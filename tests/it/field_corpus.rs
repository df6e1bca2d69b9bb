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

struct Excerpt {
    label: String,
    program: String,
    line: String,
    url: String,
    /// The log lines it is written as, in order: the line itself, or for the frozen held-out
    /// set the lines its column joins with the two characters `\n`.
    lines: Vec<String>,
}

/// The corpus's rows: every `*.tsv` but the held-out sets.
fn corpus() -> Vec<Excerpt> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/field");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tsv"))
        .filter(|p| !p.ends_with(UNSEEN) && !p.ends_with(UNSEEN2))
        .filter(|p| !HELDOUT_FILES.iter().any(|(f, _)| p.ends_with(f)))
        .collect();
    files.sort();
    read(&files)
}

/// Rows from threads found after the rows of `signatures` were written, none of them used to
/// write one: measured apart.
fn unseen(file: &str) -> Vec<Excerpt> {
    read(&[Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/field")
        .join(file)])
}

const UNSEEN: &str = "unseen.tsv";
/// The second held-out set, collected once the first had been used to change rows; measured as
/// the recogniser stood, no row changed for it (its misses are listed at its top).
const UNSEEN2: &str = "unseen2.tsv";
/// The third held-out set, frozen for issue 50 (its header says how it was made): labelled from
/// each thread before any rule of the fact recogniser was written, and no rule is written or
/// changed from it. Measured apart, by class, against the figures it had when frozen.
const HELDOUT: &str = "heldout.tsv";
/// Its top-up with /dev/shm rows (the class issue 50's quarter found short), frozen on the same
/// terms after it and before any rule was measured on either: one held-out set with it.
const HELDOUT_B: &str = "heldout_b.tsv";
/// The frozen set's files, each with the rows it was frozen with.
const HELDOUT_FILES: [(&str, usize); 2] = [(HELDOUT, 116), (HELDOUT_B, 14)];

/// A frozen file's rows, each split at the two characters `\n` into the consecutive log lines
/// it is written as (only there: another set's line may hold those characters as posted).
fn heldout(file: &str) -> Vec<Excerpt> {
    let mut rows = unseen(file);
    for e in &mut rows {
        e.lines = e.line.split("\\n").map(String::from).collect();
    }
    rows
}

fn read(files: &[std::path::PathBuf]) -> Vec<Excerpt> {
    let mut out = Vec::new();
    for file in files {
        for (n, row) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
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
                lines: vec![cols[2].into()],
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
            let mut f = std::fs::File::create(dir.join(format!("{id}-json.log"))).unwrap();
            for line in &e.lines {
                let entry = serde_json::json!({"log": format!("{line}\n"), "stream": "stderr",
                    "time": at});
                writeln!(f, "{entry}").unwrap();
            }
        } else {
            let dir = pods.join(format!(
                "field_corpus-{i}_{i:08x}-0000-4000-8000-000000000000/c"
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let mut f = std::fs::File::create(dir.join("0.log")).unwrap();
            for line in &e.lines {
                writeln!(f, "{at} stderr F {line}").unwrap();
            }
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
        let who = &d.who;
        let i: usize = match (&who.pod, &who.container_id) {
            (Some(pod), _) => pod.strip_prefix("corpus-").unwrap().parse().unwrap(),
            (None, Some(container_id)) => usize::from_str_radix(container_id, 16).unwrap(),
            _ => panic!("{who:?}"),
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

/// Which set a line is measured in: the corpus split in two halves by its thread, or the rows
/// added from threads not read while the rows of `signatures` were written (`unseen.tsv`, and
/// `unseen2.tsv` once the first had been used to change rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Set {
    A,
    B,
    Unseen,
    Unseen2,
}

impl Set {
    fn name(self) -> &'static str {
        match self {
            Set::A => "A",
            Set::B => "B",
            Set::Unseen => "unseen",
            Set::Unseen2 => "unseen 2",
        }
    }
}

/// A thread's URL without its comment anchor, so that one thread's lines fall in one half.
fn thread(url: &str) -> &str {
    url.split('#').next().unwrap_or(url)
}

/// FNV-1a 64 of the thread's URL: stable across Rust releases and platforms (std's hasher is
/// not promised to be), so a row stays in its half for good.
fn half(url: &str) -> Set {
    let h = thread(url).bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    if h % 2 == 0 {
        Set::A
    } else {
        Set::B
    }
}

/// The kinds told on `e`: a judged match (told only with a full /dev/shm) counts only on a trap.
fn told_kinds<'a>(e: &Excerpt, told: &'a [(String, bool)]) -> Vec<&'a str> {
    told.iter()
        .filter(|(_, j)| !j || e.label == "none")
        .map(|(k, _)| k.as_str())
        .collect()
}

/// One set's measure: recall per kind, false positives (on traps and wrong kinds), and the
/// context lines judged by /dev/shm's state.
#[derive(Default)]
struct Measure {
    by_kind: BTreeMap<String, Tally>,
    traps: usize,
    false_positives: Vec<String>,
    context: (usize, usize),
    judged: usize,
}

impl Measure {
    fn add(&mut self, e: &Excerpt, told: &[(String, bool)]) {
        // A judged match is told only with a full /dev/shm (correlate decides, tested there):
        // it counts as told on no line here, and on a trap it is a false positive.
        let kinds = told_kinds(e, told);
        if e.label == "context" && told.iter().any(|(_, j)| *j) {
            self.judged += 1;
        }
        match e.label.as_str() {
            "none" => {
                self.traps += 1;
                if !kinds.is_empty() {
                    self.false_positives
                        .push(format!("{kinds:?} <- {} ({})", e.line, e.url));
                }
            }
            "context" => {
                self.context.0 += 1;
                if !kinds.is_empty() {
                    self.context.1 += 1;
                    println!(
                        "  context line told alone as {kinds:?}: {} ({})",
                        e.line, e.url
                    );
                }
            }
            label => {
                let t = self.by_kind.entry(label.to_string()).or_default();
                t.lines += 1;
                if kinds.contains(&label) {
                    t.hit += 1;
                } else {
                    if !kinds.is_empty() {
                        t.wrong += 1;
                        self.false_positives.push(format!(
                            "{kinds:?}, labelled {label} <- {} ({})",
                            e.line, e.url
                        ));
                    }
                    println!("  missed ({label}): {} ({})", e.line, e.url);
                }
            }
        }
    }

    fn recall(&self) -> f64 {
        let (lines, hit) = self
            .by_kind
            .values()
            .fold((0, 0), |(l, h), t| (l + t.lines, h + t.hit));
        hit as f64 / lines.max(1) as f64
    }

    fn print(&self, name: &str) {
        println!(
            "\n{name} | kind | lines | told | recall | wrong kind |\n|---|---:|---:|---:|---:|"
        );
        for (kind, t) in &self.by_kind {
            println!(
                "| {kind} | {} | {} | {:.1}% | {} |",
                t.lines,
                t.hit,
                100.0 * t.hit as f64 / t.lines as f64,
                t.wrong
            );
        }
        let lines: usize = self.by_kind.values().map(|t| t.lines).sum();
        println!(
            "| all | {lines} | | {:.1}% | |\ntraps: {}, false positives: {}; context-only \
             lines: {}, told alone: {}, told only with /dev/shm full: {}",
            100.0 * self.recall(),
            self.traps,
            self.false_positives.len(),
            self.context.0,
            self.context.1,
            self.judged
        );
        for fp in &self.false_positives {
            println!("  FALSE POSITIVE: {fp}");
        }
    }
}

/// Recall measured per set (CRI and Docker alike) less a small margin: a regression fails.
/// Measured: A 97.2% (72 lines), B 100% (56), unseen 100% (12; 75% when first measured, before
/// two rows were changed for its misses: see unseen.tsv), unseen 2 90.0% (18 of 20, measured
/// once with nothing changed; its floor is that figure, not raised). With the fact tier and
/// facts.tsv's rows in the halves: A 97.5% (80), B 98.4% (64), unseen 100%, unseen 2 100% (its
/// two misses, known before, named by their facts).
const FLOORS: [(Set, f64); 4] = [
    (Set::A, 0.95),
    (Set::B, 0.97),
    (Set::Unseen, 0.90),
    (Set::Unseen2, 0.90),
];

/// False positives measured on a held-out set and kept as measured (no row or label changed
/// after the first run): joblib's sem_open warning, word for word the real one, that a module
/// name clash made up (joblib#127). Any other false positive fails.
const MEASURED_FALSE_POSITIVES: [(Set, &str); 1] =
    [(Set::Unseen2, "(https://github.com/joblib/joblib/pull/127)")];

/// The false positives of `set` not among those measured and kept.
fn new_false_positives(set: Set, m: &Measure) -> usize {
    m.false_positives
        .iter()
        .filter(|fp| {
            !MEASURED_FALSE_POSITIVES
                .iter()
                .any(|(s, url)| *s == set && fp.ends_with(url))
        })
        .count()
}

#[test]
fn the_field_corpus_is_told_as_labelled() {
    let mut excerpts = corpus();
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
    let sets: Vec<Set> = excerpts
        .iter()
        .map(|e| half(&e.url))
        .chain(unseen(UNSEEN).iter().map(|_| Set::Unseen))
        .chain(unseen(UNSEEN2).iter().map(|_| Set::Unseen2))
        .collect();
    excerpts.extend(unseen(UNSEEN));
    excerpts.extend(unseen(UNSEEN2));
    let threads = |set: Set| {
        let mut t: Vec<&str> = excerpts
            .iter()
            .zip(&sets)
            .filter(|(_, s)| **s == set)
            .map(|(e, _)| thread(&e.url))
            .collect();
        t.sort_unstable();
        t.dedup();
        t.len()
    };
    let mut failures = Vec::new();
    for docker in [false, true] {
        let told = told(&excerpts, docker);
        let log = if docker { "Docker json-file" } else { "CRI" };
        let mut both = Measure::default();
        for (set, floor) in FLOORS {
            let mut m = Measure::default();
            for ((e, t), s) in excerpts.iter().zip(&told).zip(&sets) {
                if *s == set {
                    m.add(e, t);
                    if matches!(set, Set::A | Set::B) {
                        both.add(e, t);
                    }
                }
            }
            m.print(&format!("{log}, {} ({} threads)", set.name(), threads(set)));
            if new_false_positives(set, &m) > 0 || m.recall() < floor {
                failures.push(format!(
                    "{log} {}: recall {:.1}% (floor {:.0}%), {} false positives",
                    set.name(),
                    100.0 * m.recall(),
                    100.0 * floor,
                    m.false_positives.len()
                ));
            }
        }
        both.print(&format!("{log}, A and B"));
        // The fault lines with no cause of their own (a shell's bus error, Chromium's out of
        // memory) are in the corpus: each must reach the state judgement, not be dropped.
        assert!(
            both.judged > 0,
            "no context line was judged by /dev/shm's state"
        );
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
        let Some(pod) = &d.who.pod else {
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
                evidence.contains("(after: ")
                    && ["SemLock(", "rebuild_cuda_tensor", "_new_shared_cuda("]
                        .iter()
                        .any(|hint| evidence.contains(hint)),
                "the line that decided is told: {evidence}"
            );
        }
    }
}

/// The kinds of a /dev/shm death (`check --json` failures[].kind) and of a GPU-path failure,
/// by which the frozen held-out set is measured per class.
const SHM_KINDS: [&str; 8] = [
    "shm_allocation_failed",
    "shm_bus_error",
    "shm_oom_killed",
    "shm_not_shared",
    "shm_unavailable",
    "fd_limit_reached",
    "shm_evicted",
    "shm_fallback",
];
const GPU_KINDS: [&str; 16] = [
    "gpu_peer_access_refused",
    "gpu_too_many_peers",
    "gpu_ecc_uncorrectable",
    "gpu_fabric_not_ready",
    "gpu_peer_mapping_failed",
    "cuda_ipc_invalid_device",
    "cuda_ipc_denied",
    "imex_channel_missing",
    "nvls_multicast_failed",
    "nccl_ranks_dead",
    "nccl_p2p_disabled",
    "iommu_not_passthrough",
    "gpu_job_crashed",
    "gpu_collective_timeout",
    "gpu_nvlink_error",
    "gpu_p2p_failed",
];

/// The frozen set's measure. Per kind: its rows, those told as labelled, and those told as
/// another kind (whether or not the label was told too). Per class: rows named / rows. A wrong
/// blame is any kind told on a trap, or a kind other than the label on a labelled row; context
/// rows are counted apart (told alone from the line, or told only with /dev/shm full). Counts
/// only: its lines are not printed, so that no rule is written from what a run shows.
#[derive(Default)]
struct HeldOut {
    by_kind: BTreeMap<String, Tally>,
    shm: (usize, usize),
    gpu: (usize, usize),
    traps: usize,
    wrong_blames: usize,
    context: (usize, usize, usize),
}

impl HeldOut {
    fn add(&mut self, e: &Excerpt, told: &[(String, bool)]) {
        // As in `Measure`: a judged match is told only with a full /dev/shm, so it names no
        // labelled row here, and on a trap it is a wrong blame.
        let kinds = told_kinds(e, told);
        let label = e.label.as_str();
        if label == "context" {
            self.context.0 += 1;
            self.context.1 += usize::from(!kinds.is_empty());
            self.context.2 += usize::from(told.iter().any(|(_, j)| *j));
            return;
        }
        let wrong = kinds.iter().any(|k| *k != label);
        self.wrong_blames += usize::from(wrong);
        if label == "none" {
            self.traps += 1;
            return;
        }
        let named = kinds.contains(&label);
        let t = self.by_kind.entry(label.to_string()).or_default();
        t.lines += 1;
        t.hit += usize::from(named);
        t.wrong += usize::from(wrong);
        let class = if SHM_KINDS.contains(&label) {
            &mut self.shm
        } else {
            assert!(GPU_KINDS.contains(&label), "{label}: a kind of no class");
            &mut self.gpu
        };
        class.0 += usize::from(named);
        class.1 += 1;
    }

    fn print(&self, name: &str) {
        println!("\n{name} | kind | lines | told right | told wrong |\n|---|---:|---:|---:|");
        for (kind, t) in &self.by_kind {
            println!("| {kind} | {} | {} | {} |", t.lines, t.hit, t.wrong);
        }
        let pct = |(n, of): (usize, usize)| 100.0 * n as f64 / of.max(1) as f64;
        println!(
            "/dev/shm deaths named: {} of {} ({:.1}%); GPU-path failures named: {} of {} \
             ({:.1}%); wrong blames: {} ({} traps); context rows: {}, told alone: {}, told only \
             with /dev/shm full: {}",
            self.shm.0,
            self.shm.1,
            pct(self.shm),
            self.gpu.0,
            self.gpu.1,
            pct(self.gpu),
            self.wrong_blames,
            self.traps,
            self.context.0,
            self.context.1,
            self.context.2
        );
    }
}

/// The frozen set's composition (the files' headers) and its figures "before", both files as one
/// set: measured once on the recogniser as it stood when heldout_b.tsv was frozen (commit
/// 90b5296; heldout.tsv alone gave the same as when it was frozen, 680d58c), CRI and Docker
/// alike: /dev/shm deaths 18 of 33 named (54.5%; heldout_b.tsv's 4 of 10), GPU-path failures 19
/// of 55 (34.5%), no wrong blame (35 traps), 7 context rows of which none told alone and 2 told
/// only with /dev/shm full.
/// "After", with the fact tier and the hang judge (merge of i50-recog), CRI and Docker alike:
/// /dev/shm deaths 21 of 33 (63.6%; heldout_b.tsv's 5 of 10), GPU-path failures 36 of 55
/// (65.5%: the 12 collective timeouts, both NVLink errors, 3 of the 12 failed peer/IPC calls),
/// no wrong blame (35 traps), context rows as before. Those are the floors: never lowered, and no
/// rule is written from the set.
const HELDOUT_SHM: (usize, usize) = (21, 33);
const HELDOUT_GPU: (usize, usize) = (36, 55);
const HELDOUT_WRONG_BLAMES: usize = 0;

#[test]
fn the_frozen_held_out_set_is_told_no_worse_than_when_frozen() {
    let (mut excerpts, mut file_of) = (Vec::new(), Vec::new());
    for (file, rows) in HELDOUT_FILES {
        let read = heldout(file);
        assert_eq!(read.len(), rows, "the frozen set changed: {file}");
        file_of.extend(read.iter().map(|_| file));
        excerpts.extend(read);
    }
    let mut failures = Vec::new();
    for docker in [false, true] {
        let told = told(&excerpts, docker);
        let log = if docker { "Docker json-file" } else { "CRI" };
        // Each file's figures are printed too, counts only like the set's.
        for (file, _) in HELDOUT_FILES {
            let mut m = HeldOut::default();
            for ((e, t), f) in excerpts.iter().zip(&told).zip(&file_of) {
                if *f == file {
                    m.add(e, t);
                }
            }
            m.print(&format!("{log}, held out (frozen), {file}"));
        }
        let mut m = HeldOut::default();
        for (e, t) in excerpts.iter().zip(&told) {
            m.add(e, t);
        }
        m.print(&format!("{log}, held out (frozen), both files"));
        assert_eq!((m.shm.1, m.gpu.1), (HELDOUT_SHM.1, HELDOUT_GPU.1));
        if m.shm.0 < HELDOUT_SHM.0
            || m.gpu.0 < HELDOUT_GPU.0
            || m.wrong_blames > HELDOUT_WRONG_BLAMES
        {
            failures.push(format!(
                "{log}: /dev/shm {} of {}, GPU-path {} of {}, wrong blames {}",
                m.shm.0, m.shm.1, m.gpu.0, m.gpu.1, m.wrong_blames
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
