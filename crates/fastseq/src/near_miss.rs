//! "Did you mean": the names close to a misspelt one, for error messages. At the bottom of
//! the layers: any module may use it.

/// Up to three names from `candidates` close to `name`, best first, for "did you mean".
pub fn near_misses<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let lower = name.to_lowercase();
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter_map(|c| {
            let cl = c.to_lowercase();
            let d = if cl == lower {
                0
            } else if !lower.is_empty() && (cl.contains(&lower) || lower.contains(&cl)) {
                1
            } else {
                edit_distance(&lower, &cl)
            };
            let limit = (name.chars().count().max(c.chars().count()) / 3).max(2);
            (d <= limit).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// " (did you mean 'a' or 'b'?)" or "", for error messages.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let near = near_misses(name, candidates);
    match near.as_slice() {
        [] => String::new(),
        [one] => format!(" (did you mean '{one}'?)"),
        many => {
            let quoted: Vec<String> = many.iter().map(|c| format!("'{c}'")).collect();
            format!(" (did you mean {}?)", quoted.join(" or "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_rank_close_names_first() {
        let c = ["logits", "probs", "hidden_state"];
        assert_eq!(near_misses("logit", c), vec!["logits"]);
        assert_eq!(near_misses("LOGITS", c), vec!["logits"]);
        assert!(near_misses("zzzzzzzz", c).is_empty());
        assert_eq!(did_you_mean("prob", c), " (did you mean 'probs'?)");
    }
}
