//! Rule 6: one finding per problem a person acts on: a lost GPU; a GPU all of whose pairs fail
//! (the broken-GPU case, named once rather than once per pair); every pair failing (a node-wide
//! cause); else each failing pair; and link errors that did not make any pair fail.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::board::Board;
use super::reasons::Judged;
use super::rules::window::Notice;
use super::PairRules;
use crate::gpu::blame::{blame, PairOutcome};
use crate::model::{Blame, SuspectBy, Weight};
use crate::model::{Finding, FindingKind, Severity, Subject};
use crate::text;

/// The findings, and which GPUs they blame.
pub(super) fn findings(
    board: &Board<'_>,
    judged: &[Judged],
    notices: Vec<Notice>,
    rules: &PairRules,
) -> (Vec<Finding>, Blame) {
    let outcomes: Vec<PairOutcome<'_>> = judged
        .iter()
        .map(|j| PairOutcome {
            gpu: j.verdict.gpu,
            peer_gpu: j.verdict.peer_gpu,
            failing: j.weight.is_some(),
            reasons: &j.verdict.reasons,
        })
        .collect();
    let blame = blame(&outcomes, &board.lost);
    // GPUs all of whose pairs fail (the broken-GPU case): one finding each, not one per pair.
    let culprits: BTreeSet<u32> = blame
        .suspects
        .iter()
        .filter(|s| s.by == SuspectBy::FailsWithAll && !board.lost.contains(&s.gpu))
        .map(|s| s.gpu)
        .collect();
    let mut out = lost_findings(board, judged);
    out.extend(failing_findings(board, judged, &culprits, blame.node_wide));
    out.extend(link_error_findings(
        board,
        judged,
        notices,
        &culprits,
        blame.node_wide,
        rules,
    ));
    (out, blame)
}

/// A lost GPU is one problem, whatever else is wrong.
fn lost_findings(board: &Board<'_>, judged: &[Judged]) -> Vec<Finding> {
    board
        .lost
        .iter()
        .map(|&g| {
            let down: Vec<u32> = judged
                .iter()
                .filter(|j| j.has(g))
                .map(|j| j.other(g))
                .collect();
            Finding::new(
                FindingKind::GpuLost,
                Subject::Gpu(g),
                text::gpu_lost(g, &board.describe(g), &down),
            )
        })
        .collect()
}

/// Among GPUs still there: every pair failing (the node), else each GPU failing with all its
/// peers, and each failing pair of the others.
fn failing_findings(
    board: &Board<'_>,
    judged: &[Judged],
    culprits: &BTreeSet<u32>,
    node_wide: bool,
) -> Vec<Finding> {
    let failing: Vec<&Judged> = judged
        .iter()
        .filter(|j| j.weight.is_some() && !board.is_lost(j.key()))
        .collect();
    if node_wide {
        let live = board.indices.difference(&board.lost).count();
        return vec![node_finding(&failing, live)];
    }
    let mut out = Vec::new();
    for &g in culprits {
        let own: Vec<&Judged> = judged
            .iter()
            .filter(|j| j.has(g) && !board.lost.contains(&j.other(g)))
            .collect();
        out.push(gpu_finding(board, g, &own));
    }
    for j in failing
        .iter()
        .filter(|j| !culprits.contains(&j.verdict.gpu) && !culprits.contains(&j.verdict.peer_gpu))
    {
        out.push(pair_finding(j));
    }
    out
}

/// Counter growth that made no pair fail: one warning per GPU.
fn link_error_findings(
    board: &Board<'_>,
    judged: &[Judged],
    notices: Vec<Notice>,
    culprits: &BTreeSet<u32>,
    node_wide: bool,
    rules: &PairRules,
) -> Vec<Finding> {
    let not_ok: HashSet<(u32, u32)> = judged
        .iter()
        .filter(|j| j.weight.is_some())
        .map(Judged::key)
        .collect();
    let mut per_gpu: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for n in notices {
        let covered = node_wide
            || board.lost.contains(&n.gpu)
            || culprits.contains(&n.gpu)
            || (!n.affected.is_empty() && n.affected.iter().all(|p| not_ok.contains(p)));
        if !covered {
            per_gpu
                .entry(n.gpu)
                .or_default()
                .push(text::link_growth(n.link, &n.parts));
        }
    }
    per_gpu
        .into_iter()
        .map(|(g, parts)| {
            Finding::new(
                FindingKind::GpuLinkErrors,
                Subject::Gpu(g),
                text::link_errors(g, &board.describe(g), rules.window, &parts),
            )
        })
        .collect()
}

fn worst(pairs: &[&Judged]) -> Option<Weight> {
    pairs.iter().filter_map(|j| j.weight).max()
}

fn state_of(pairs: &[&Judged]) -> &'static str {
    let down = pairs.iter().any(|j| j.weight == Some(Weight::Down));
    let degraded = pairs
        .iter()
        .any(|j| matches!(j.weight, Some(Weight::Errors | Weight::Broken)));
    match (down, degraded) {
        (true, true) => "down or degraded",
        (true, false) => "down",
        _ => "degraded",
    }
}

fn kind_of(weight: Option<Weight>) -> FindingKind {
    if weight == Some(Weight::Down) {
        FindingKind::GpuLinkDown
    } else {
        FindingKind::GpuPairDegraded
    }
}

/// Distinct reasons of some pairs, at most `max` of them, as one sentence.
fn brief_reasons(pairs: &[&Judged], max: usize) -> String {
    let mut distinct: Vec<&str> = Vec::new();
    for r in pairs.iter().flat_map(|j| &j.verdict.reasons) {
        if !distinct.contains(&r.as_str()) {
            distinct.push(r.as_str());
        }
    }
    text::some_reasons(&distinct, max)
}

/// The broken-GPU case: GPU `g` fails with every other GPU. Always critical: whatever the
/// cause, every multi-GPU job placed on it is affected.
fn gpu_finding(board: &Board<'_>, g: u32, pairs: &[&Judged]) -> Finding {
    let peers: Vec<u32> = pairs.iter().map(|j| j.other(g)).collect();
    Finding {
        severity: Severity::Critical,
        kind: kind_of(worst(pairs)),
        subject: Subject::Gpu(g),
        message: text::gpu_fails_with_all(
            g,
            &board.describe(g),
            &peers,
            state_of(pairs),
            &brief_reasons(pairs, 8),
        ),
    }
}

/// Every pair of every live GPU fails: a node-wide cause (fabric manager, platform, driver).
fn node_finding(pairs: &[&Judged], gpus: usize) -> Finding {
    let weight = worst(pairs);
    Finding {
        severity: weight.map_or(Severity::Warning, Weight::severity),
        kind: kind_of(weight),
        subject: Subject::AllGpus,
        message: text::all_pairs_fail(pairs.len(), gpus, state_of(pairs), &brief_reasons(pairs, 8)),
    }
}

fn pair_finding(j: &Judged) -> Finding {
    let (a, b) = j.key();
    Finding {
        severity: j.weight.map_or(Severity::Warning, Weight::severity),
        kind: kind_of(j.weight),
        subject: Subject::GpuPair(a, b),
        message: text::pair_fails(a, b, j.verdict.status, j.weight, &j.verdict.reasons),
    }
}
