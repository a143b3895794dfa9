//! Tensors: element type names, the bytes a tensor's type and dims need, whether its data
//! is external, and a walk over every tensor of a graph (subgraphs and node attributes
//! included; nodes are kept as bytes and re-encoded only when a tensor in them changed).
use crate::codec::proto::{tensor_proto, tensor_proto::DataLocation, GraphProto, TensorProto};
use crate::error::Result;

/// "float", "int64", ... for an element type.
pub fn elem_type_name(t: i32) -> String {
    tensor_proto::DataType::try_from(t).map(|d| d.as_str_name().to_lowercase()).unwrap_or_else(|_| format!("type {t}"))
}

/// Calls `f` on every tensor of `g` and of its subgraphs: initializers, sparse initializers
/// and the tensors of node attributes. `f` returns whether it changed the tensor; a node
/// (kept as bytes) is encoded again only then.
pub(crate) fn for_each_tensor(
    g: &mut GraphProto,
    f: &mut impl FnMut(&mut TensorProto) -> Result<bool>,
) -> Result<bool> {
    let mut changed = false;
    for t in &mut g.initializer {
        changed |= f(t)?;
    }
    for s in &mut g.sparse_initializer {
        if let Some(t) = s.values.as_mut() {
            changed |= f(t)?;
        }
        if let Some(t) = s.indices.as_mut() {
            changed |= f(t)?;
        }
    }
    for raw in &mut g.node {
        if !crate::codec::node::has_tensors_or_graphs(raw) {
            continue;
        }
        // Checked when the model was decoded: a node that does not decode is not reached.
        let Ok(mut n) = crate::codec::node::decode(raw) else { continue };
        let mut node_changed = false;
        for a in &mut n.attribute {
            if let Some(t) = a.t.as_mut() {
                node_changed |= f(t)?;
            }
            for t in &mut a.tensors {
                node_changed |= f(t)?;
            }
            for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                node_changed |= for_each_tensor(sub, f)?;
            }
        }
        if node_changed {
            *raw = crate::codec::node::encode(&n);
            changed = true;
        }
    }
    Ok(changed)
}

/// Calls `f` on every tensor of `g` and of its subgraphs, without changing anything.
pub(crate) fn visit_tensors(g: &GraphProto, f: &mut impl FnMut(&TensorProto) -> Result<()>) -> Result<()> {
    g.initializer.iter().try_for_each(&mut *f)?;
    for s in &g.sparse_initializer {
        s.values.iter().chain(s.indices.iter()).try_for_each(&mut *f)?;
    }
    for raw in g.node.iter().filter(|raw| crate::codec::node::has_tensors_or_graphs(raw)) {
        let Ok(n) = crate::codec::node::decode(raw) else { continue };
        for a in &n.attribute {
            a.t.iter().chain(a.tensors.iter()).try_for_each(&mut *f)?;
            a.g.iter().chain(a.graphs.iter()).try_for_each(|sub| visit_tensors(sub, f))?;
        }
    }
    Ok(())
}

/// The number of bytes a tensor's data takes in `raw_data` (and so in external data),
/// from its type and dims: None when the type has no fixed packing (strings, types this
/// schema does not size), an error for dims that are negative or overflow.
pub fn expected_bytes(t: &TensorProto) -> std::result::Result<Option<u64>, String> {
    // Bits per element; sub-byte types are packed (two 4-bit or four 2-bit values a byte).
    let bits: u64 = match t.data_type.unwrap_or(0) {
        2 | 3 | 9 | 17 | 18 | 19 | 20 | 24 => 8,
        4 | 5 | 10 | 16 => 16,
        1 | 6 | 12 => 32,
        7 | 11 | 13 | 14 => 64,
        15 => 128,
        21..=23 => 4,
        25 | 26 => 2,
        _ => return Ok(None),
    };
    let mut count: u64 = 1;
    for &d in &t.dims {
        let d = u64::try_from(d).map_err(|_| format!("negative dimension {d} in {:?}", t.dims))?;
        count = count.checked_mul(d).ok_or_else(|| format!("dims {:?} overflow", t.dims))?;
    }
    let total = count.checked_mul(bits).ok_or_else(|| format!("dims {:?} overflow", t.dims))?;
    Ok(Some(total.div_ceil(8)))
}

pub fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(DataLocation::External as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(data_type: i32, dims: &[i64]) -> TensorProto {
        TensorProto { data_type: Some(data_type), dims: dims.to_vec(), ..Default::default() }
    }

    #[test]
    fn sizes_follow_type_and_dims() {
        assert_eq!(expected_bytes(&tensor(1, &[2, 3])), Ok(Some(24)));
        assert_eq!(expected_bytes(&tensor(1, &[])), Ok(Some(4)), "a scalar is one element");
        assert_eq!(expected_bytes(&tensor(1, &[0, 5])), Ok(Some(0)));
        assert_eq!(expected_bytes(&tensor(22, &[5])), Ok(Some(3)), "int4: two a byte, rounded up");
        assert_eq!(expected_bytes(&tensor(23, &[4])), Ok(Some(2)));
        assert_eq!(expected_bytes(&tensor(25, &[5])), Ok(Some(2)), "uint2: four a byte");
        assert_eq!(expected_bytes(&tensor(15, &[3])), Ok(Some(48)));
        assert_eq!(expected_bytes(&tensor(8, &[3])), Ok(None), "strings have no fixed size");
        assert_eq!(expected_bytes(&tensor(999, &[3])), Ok(None));
        assert!(expected_bytes(&tensor(1, &[-1])).is_err());
        assert!(expected_bytes(&tensor(1, &[i64::MAX, i64::MAX])).is_err());
        assert!(expected_bytes(&tensor(7, &[1 << 61])).is_err(), "bits overflow");
    }
}
