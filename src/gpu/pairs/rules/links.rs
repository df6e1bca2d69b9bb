//! Rules 1 and 2: lost GPUs and inactive links (to GPUs and to NVSwitches).

use std::collections::BTreeMap;

use crate::gpu::pairs::board::{ordered, Board};
use crate::gpu::pairs::reasons::PairState;
use crate::model::Peer;
use crate::model::{PairReason, ReasonKind, Weight};
use crate::text;

/// Rule 1: a lost GPU's pairs are down.
pub(crate) fn lost_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    for (&(a, b), st) in pairs.iter_mut() {
        for g in [a, b] {
            if board.lost.contains(&g) {
                st.push(
                    PairReason::new(ReasonKind::GpuLost, Weight::Down, text::reason_gpu_lost(g))
                        .naming(&[g]),
                );
            }
        }
    }
}

/// Rule 2: inactive links to GPUs and to NVSwitches; `links` of each pair.
pub(crate) fn link_state_rule(board: &Board<'_>, pairs: &mut BTreeMap<(u32, u32), PairState>) {
    for (&a, gpu) in &board.gpus {
        if gpu.lost {
            continue;
        }
        let mut switch_links = 0usize;
        let mut switch_down = Vec::new();
        for link in &gpu.links {
            match &link.peer {
                Peer::Gpu(b) if *b != a => {
                    let key = ordered(a, *b);
                    let Some(st) = pairs.get_mut(&key) else {
                        continue;
                    };
                    if key.0 == a {
                        st.links.push(link.link);
                    }
                    if !link.active {
                        st.push(
                            PairReason::new(
                                ReasonKind::LinkInactive,
                                Weight::Down,
                                text::reason_link_inactive(link.link, a, *b),
                            )
                            .naming(&[a, *b])
                            .on_links(&[link.link]),
                        );
                    }
                }
                Peer::Switch => {
                    switch_links += 1;
                    if !link.active {
                        switch_down.push(link.link);
                    }
                }
                _ => {}
            }
        }
        if switch_down.is_empty() {
            continue;
        }
        let reason = if switch_down.len() == switch_links {
            PairReason::new(
                ReasonKind::SwitchLinksDown,
                Weight::Down,
                text::reason_switch_links_down(a, switch_links),
            )
        } else {
            PairReason::new(
                ReasonKind::SwitchLinksSomeDown,
                Weight::Broken,
                text::reason_switch_links_some_down(a, &switch_down, switch_links),
            )
        }
        .naming(&[a])
        .on_links(&switch_down);
        for (_, st) in pairs.iter_mut().filter(|((x, y), _)| *x == a || *y == a) {
            st.push(reason.clone());
        }
    }
}
