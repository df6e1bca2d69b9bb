//! The one windowed history of a link's counters, per (GPU key, link), that the counter rules
//! measure growth over (rule 3, `counters.rs`; rule 3b, `nvlink5.rs`); and what they hand the
//! findings: growth that degraded no pair ([`Notice`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::gpu::pairs::board::{ordered, Board};
use crate::gpu::pairs::reasons::PairState;
use crate::model::{GpuReading, LinkReading, Peer};

/// A set of counters that only grow until the driver starts them over.
pub(crate) trait Counters: Copy {
    /// Every counter, in one order.
    fn each(&self) -> impl IntoIterator<Item = u64>;

    /// Whether some counter of `newer` is below this one's (a driver reload, a GPU reset).
    fn went_down(&self, newer: &Self) -> bool {
        newer
            .each()
            .into_iter()
            .zip(self.each())
            .any(|(new, old)| new < old)
    }
}

/// One link's samples that cover the window, oldest first, plus the newest one just outside it
/// (the baseline growth is measured from).
pub(crate) type Window<T> = VecDeque<(Instant, T)>;

/// What one scan says of one link's counters.
pub(crate) enum Reading<T> {
    Counts(T),
    /// None this time: the window so far is judged, and kept.
    Missing,
    /// Not judged now; the window is kept for when it is.
    Wait,
}

#[derive(Debug)]
pub(crate) struct LinkWindows<T> {
    /// Per (GPU key, link), its window.
    pub by_link: HashMap<(String, u32), Window<T>>,
}

impl<T> Default for LinkWindows<T> {
    fn default() -> Self {
        LinkWindows {
            by_link: HashMap::new(),
        }
    }
}

impl<T: Counters> LinkWindows<T> {
    /// One scan at `now`: each link `read` has a reading for is brought to `now` and, unless it
    /// waits, handed to `judge` with its window (`gpu`, link). The windows of links `read` gives
    /// nothing for, or no longer on the board, are dropped.
    pub fn advance(
        &mut self,
        board: &Board<'_>,
        now: Instant,
        window: Duration,
        read: impl Fn(&GpuReading, &LinkReading) -> Option<Reading<T>>,
        mut judge: impl FnMut(u32, &LinkReading, &Window<T>),
    ) {
        let cutoff = now.checked_sub(window);
        let mut seen = HashSet::new();
        for (&a, gpu) in &board.gpus {
            for link in &gpu.links {
                let Some(reading) = read(gpu, link) else {
                    continue;
                };
                let key = (board.key(a), link.link);
                seen.insert(key.clone());
                let history = match reading {
                    Reading::Wait => continue,
                    Reading::Counts(counts) => {
                        let h = self.by_link.entry(key).or_default();
                        push(h, now, counts);
                        h
                    }
                    Reading::Missing => match self.by_link.get_mut(&key) {
                        Some(h) => {
                            if h.back().is_some_and(|(t, _)| *t > now) {
                                h.clear();
                            }
                            h
                        }
                        None => continue,
                    },
                };
                prune(history, cutoff);
                judge(a, link, history);
            }
        }
        self.by_link.retain(|key, _| seen.contains(key));
    }
}

/// A link's window as a restart carries it: each sample's age (ms) at the save, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CarriedWindow<T> {
    pub gpu: String,
    pub link: u32,
    pub samples: Vec<(u64, T)>,
}

impl<T: Counters + PartialEq> LinkWindows<T> {
    /// The windows that hold growth (what keeps pairs degraded or warned), as ages at `now`;
    /// a window without growth is only a baseline, taken again at the next start.
    pub fn carry(&self, now: Instant) -> Vec<CarriedWindow<T>> {
        let mut out: Vec<CarriedWindow<T>> = self
            .by_link
            .iter()
            .filter(|(_, w)| w.front().map(|f| f.1) != w.back().map(|b| b.1))
            .map(|((gpu, link), w)| CarriedWindow {
                gpu: gpu.clone(),
                link: *link,
                samples: w
                    .iter()
                    .map(|(t, c)| {
                        let age = now.saturating_duration_since(*t).as_millis();
                        (u64::try_from(age).unwrap_or(u64::MAX), *c)
                    })
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| (&a.gpu, a.link).cmp(&(&b.gpu, b.link)));
        out
    }

    /// Takes up carried windows, `since_save` after they were carried: the next sample of the
    /// link continues them (growth while the agent was down counts as growth then).
    pub fn resume(&mut self, carried: Vec<CarriedWindow<T>>, since_save: Duration, now: Instant) {
        for c in carried {
            let window: Window<T> = c
                .samples
                .into_iter()
                .filter_map(|(age, counts)| {
                    let age = Duration::from_millis(age).checked_add(since_save)?;
                    Some((now.checked_sub(age)?, counts))
                })
                .collect();
            if window.len() >= 2 {
                self.by_link.insert((c.gpu, c.link), window);
            }
        }
    }
}

/// Appends a sample. A counter that went down, or time that went back, starts a new baseline;
/// a second sample at the same instant replaces the first.
fn push<T: Counters>(history: &mut Window<T>, now: Instant, counts: T) {
    if let Some(&(t, last)) = history.back() {
        if now < t || last.went_down(&counts) {
            history.clear();
        } else if now == t {
            history.pop_back();
        }
    }
    history.push_back((now, counts));
}

/// Keeps the samples newer than `cutoff` and the newest one at or before it (the baseline).
fn prune<T>(history: &mut Window<T>, cutoff: Option<Instant>) {
    let Some(cutoff) = cutoff else {
        return;
    };
    while history.len() >= 2 && history.get(1).is_some_and(|(t, _)| *t <= cutoff) {
        history.pop_front();
    }
}

/// How much one counter grew across the window.
pub(crate) fn grown<T>(window: &Window<T>, counter: impl Fn(&T) -> u64) -> u64 {
    match (window.front(), window.back()) {
        (Some((_, first)), Some((_, last))) => counter(last).saturating_sub(counter(first)),
        _ => 0,
    }
}

/// The highest rate (per second) one counter grew at between two consecutive samples.
pub(crate) fn peak_rate<T>(window: &Window<T>, counter: impl Fn(&T) -> u64) -> f64 {
    let mut rate: f64 = 0.0;
    for ((t0, e0), (t1, e1)) in window.iter().zip(window.iter().skip(1)) {
        let dt = t1.saturating_duration_since(*t0).as_secs_f64();
        let grew = counter(e1).saturating_sub(counter(e0));
        if dt > 0.0 && grew > 0 {
            rate = rate.max(grew as f64 / dt);
        }
    }
    rate
}

/// Counter growth on one link that degraded nothing, for a `gpu_link_errors` warning.
pub(crate) struct Notice {
    pub gpu: u32,
    pub link: u32,
    pub parts: Vec<String>,
    /// The pairs the link serves; empty for a link to an unknown or non-GPU device.
    pub affected: Vec<(u32, u32)>,
}

impl Notice {
    /// Growth that degraded nothing on link `link` of GPU `gpu`, if there was any.
    pub fn of(gpu: u32, link: u32, parts: Vec<String>, affected: Vec<(u32, u32)>) -> Option<Self> {
        (!parts.is_empty()).then_some(Notice {
            gpu,
            link,
            parts,
            affected,
        })
    }
}

/// The pairs whose traffic crosses a link of GPU `a`.
pub(crate) fn affected_pairs(
    a: u32,
    peer: &Peer,
    pairs: &BTreeMap<(u32, u32), PairState>,
) -> Vec<(u32, u32)> {
    match peer {
        Peer::Gpu(b) if *b != a => {
            let key = ordered(a, *b);
            if pairs.contains_key(&key) {
                vec![key]
            } else {
                Vec::new()
            }
        }
        Peer::Switch => pairs
            .keys()
            .filter(|(x, y)| *x == a || *y == a)
            .copied()
            .collect(),
        _ => Vec::new(),
    }
}
