//! The order of the stages: any order of stages and edges in, an order where every edge goes
//! forward out, so that laying the stages' nodes end to end keeps the merged graph sorted.
//! Stable: the given order is kept wherever the edges allow (Kahn's algorithm, the ready
//! stage given first going next). A circle is returned as the stages it passes.
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// `n` stages joined by `edges` (from, to), both by their index in the given order.
/// Ok: the stages in graph order. Err: a circle, as the stages it passes, the first
/// repeated at the end (`[a, b, a]`; `[a, a]` for a stage feeding itself).
pub fn stage_order(n: usize, edges: impl IntoIterator<Item = (usize, usize)>) -> Result<Vec<usize>, Vec<usize>> {
    // Each stage's successors, once each, in the order the edges name them.
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (from, to) in edges {
        if !after[from].contains(&to) {
            after[from].push(to);
        }
    }
    if let Some(circle) = find_circle(&after) {
        return Err(circle);
    }
    let mut waiting = vec![0usize; n];
    for next in after.iter().flatten() {
        waiting[*next] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n).filter(|&s| waiting[s] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(s)) = ready.pop() {
        order.push(s);
        for &next in &after[s] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push(Reverse(next));
            }
        }
    }
    Ok(order)
}

/// The first circle a depth-first search finds, from the stages in the given order and
/// their successors in edge order; iterative, so that a long pipeline cannot overflow.
fn find_circle(after: &[Vec<usize>]) -> Option<Vec<usize>> {
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![0u8; after.len()];
    for root in 0..after.len() {
        if state[root] != 0 {
            continue;
        }
        let mut path = vec![root];
        // Per stage on the path: how many of its successors were looked at.
        let mut next = vec![0usize];
        state[root] = ON_PATH;
        while let (Some(&s), Some(k)) = (path.last(), next.last_mut()) {
            let Some(&m) = after[s].get(*k) else {
                state[s] = DONE;
                path.pop();
                next.pop();
                continue;
            };
            *k += 1;
            if state[m] == ON_PATH {
                let start = path.iter().position(|&p| p == m).expect("on the path");
                let mut circle = path[start..].to_vec();
                circle.push(m);
                return Some(circle);
            }
            if state[m] == 0 {
                state[m] = ON_PATH;
                path.push(m);
                next.push(0);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_given_order_is_kept_where_the_edges_allow() {
        assert_eq!(stage_order(3, []), Ok(vec![0, 1, 2]));
        assert_eq!(stage_order(3, [(0, 1), (1, 2)]), Ok(vec![0, 1, 2]));
        // Given backwards: reversed into the one order the edges allow.
        assert_eq!(stage_order(3, [(2, 1), (1, 0)]), Ok(vec![2, 1, 0]));
        // Only what must move moves: 3 feeds 1, the rest keep their places.
        assert_eq!(stage_order(4, [(3, 1)]), Ok(vec![0, 2, 3, 1]));
        // Two heads on one backbone given last: the backbone first, the heads in their order.
        assert_eq!(stage_order(3, [(2, 0), (2, 1)]), Ok(vec![2, 0, 1]));
        // Repeated edges between two stages count once.
        assert_eq!(stage_order(2, [(1, 0), (1, 0)]), Ok(vec![1, 0]));
    }

    #[test]
    fn circles_are_returned_as_the_stages_they_pass() {
        assert_eq!(stage_order(2, [(0, 1), (1, 0)]), Err(vec![0, 1, 0]));
        assert_eq!(stage_order(1, [(0, 0)]), Err(vec![0, 0]));
        assert_eq!(stage_order(4, [(0, 1), (1, 2), (2, 3), (3, 1)]), Err(vec![1, 2, 3, 1]));
        // Long: no recursion.
        let n = 20_000;
        let circle = stage_order(n, (0..n).map(|s| (s, (s + 1) % n))).unwrap_err();
        assert_eq!(circle.len(), n + 1);
        assert_eq!((circle[0], circle[n - 1], circle[n]), (0, n - 1, 0));
    }
}
