//! What the analysis knows of one value: its dims (which of them is the batch axis), the
//! elements of a small integer tensor (shape arithmetic), small float constants, and
//! whether its values are computed from the number of rows.
use crate::codec::proto::{AttributeProto, NodeProto, TensorProto};

/// One dimension of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A size known from the graph.
    Fixed(i64),
    /// The batch axis: one entry per row of the batch, each computed from that row alone.
    Batch,
    /// A size the graph does not tell, but the same whatever the batch (it follows the
    /// inputs' other axes, which every request of one batch shares); `Some`: known to be the
    /// size of that axis of a graph input, so that two of them with one [`Sym`] are one size.
    Free(Option<Sym>),
}

/// Which size an unknown size is: axis `axis` of graph input number `input` (one request's,
/// the same for every request of a batch, which the batcher joins only when their other axes
/// agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sym {
    pub input: u32,
    pub axis: u32,
}

/// One element of a small integer tensor: what shape arithmetic computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Known(i64),
    /// Not known, but the same whatever the batch; `Some`: the size of that input axis.
    Free(Option<Sym>),
    /// Exactly the number of rows.
    Batch,
    /// The number of rows times this (> 1): the size of a batch axis merged with other
    /// axes (attention's `[L, N * heads, D]`).
    Rows(i64),
    /// Computed from the number of rows (not the number itself).
    OnN,
}

impl Elem {
    pub fn on_n(self) -> bool {
        matches!(self, Elem::Batch | Elem::Rows(_) | Elem::OnN)
    }

    /// The number of rows times `c`, as an element.
    pub fn rows(c: i64) -> Elem {
        if c == 1 {
            Elem::Batch
        } else {
            Elem::Rows(c)
        }
    }

    /// How many entries per row, if it is the number of rows times a known factor.
    pub fn per_row(self) -> Option<i64> {
        match self {
            Elem::Batch => Some(1),
            Elem::Rows(c) => Some(c),
            _ => None,
        }
    }
}

/// A value that no row mixing has reached (yet).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct T {
    /// None: not even the rank is known (never for a value with a batch axis).
    pub dims: Option<Vec<Dim>>,
    /// The elements of an integer tensor of rank 0 or 1, where known.
    pub ints: Option<Vec<Elem>>,
    /// The values of a small float constant.
    pub floats: Option<Vec<f64>>,
    /// Its values are computed from the number of rows (a batch size used as data).
    pub on_n: bool,
    /// Rows whose rank is not known (an input declared without a shape): only element-wise
    /// operators follow it, with its batch axis first.
    pub loose: bool,
    /// A batch axis merged with other axes, `(outer, inner)`: it holds `outer` blocks of N
    /// rows of `inner` entries each (size `outer * N * inner`), in that order, as a Reshape
    /// of `[.., outer, N, inner, ..]` lays them out. None: one entry per row. Values whose
    /// batch axes are merged differently are never combined.
    pub merged: Option<(i64, i64)>,
    /// Each row's place in the batch, used as an index (the `place` rules).
    pub place: Option<Place>,
    /// Every value of this integer tensor lies in `[0, below)`, `below` a known number or
    /// an input's size (a Range's, through Unsqueeze).
    pub below: Option<Elem>,
    /// A batch axis merged with an axis of unknown size: each row's entries, as many as that
    /// size, one row after the other (`Flatten` of `[N, L]`); read by the `place` rules only.
    pub flat: Option<Sym>,
}

/// Why a value holding the rows' places is refused wherever it is not an index into the
/// row's own entries.
pub const BY_PLACE: &str = "its values depend on each row's place";

/// The values of a tensor with a batch axis that index a batch laid out one row after the
/// other: row `b`'s values are `b * stride + k`, `0 <= k < within`; each a known number or an
/// input's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub stride: Elem,
    pub within: Elem,
}

impl T {
    /// A value of these dims, the same whatever the batch unless a dim is the batch axis.
    pub fn shaped(dims: Vec<Dim>) -> T {
        T { dims: Some(dims), ..T::default() }
    }

    /// Small integers: a scalar (rank 0) or a vector.
    pub fn ints(scalar: bool, elems: Vec<Elem>) -> T {
        let dims = if scalar { vec![] } else { vec![Dim::Fixed(elems.len() as i64)] };
        let on_n = elems.iter().any(|e| e.on_n());
        T { dims: Some(dims), ints: Some(elems), on_n, ..T::default() }
    }

    /// A value whose shape is not known: the same whatever the batch, unless `on_n`.
    pub fn opaque(on_n: bool) -> T {
        T { on_n, ..T::default() }
    }

    pub fn rank(&self) -> Option<usize> {
        self.dims.as_ref().map(Vec::len)
    }

    /// Where its batch axis is, if it has one.
    pub fn batch(&self) -> Option<usize> {
        self.dims.as_ref()?.iter().position(|d| *d == Dim::Batch)
    }

    /// How the batch axis holds the rows: `(outer, inner)`, `(1, 1)` for one entry per row.
    pub fn layout(&self) -> (i64, i64) {
        self.merged.unwrap_or((1, 1))
    }

    /// The same whatever the batch: no batch axis, nothing computed from the row count.
    pub fn fixed(&self) -> bool {
        self.batch().is_none() && !self.on_n && !self.loose
    }

    pub fn scalar(&self) -> bool {
        self.rank() == Some(0)
    }

    /// Its integer elements, if all of them are known.
    pub fn known(&self) -> Option<Vec<i64>> {
        self.ints.as_ref()?.iter().map(|e| if let Elem::Known(v) = e { Some(*v) } else { None }).collect()
    }

    /// Its one element, if it has one known element.
    pub fn known_one(&self) -> Option<i64> {
        match self.known()?.as_slice() {
            [v] => Some(*v),
            _ => None,
        }
    }

    /// Its dims, where its rank is known.
    pub fn dims(&self) -> Option<&[Dim]> {
        self.dims.as_deref()
    }

    /// The number of elements, where every dim is known.
    pub fn numel(&self) -> Option<i64> {
        self.dims
            .as_ref()?
            .iter()
            .try_fold(1i64, |acc, d| if let Dim::Fixed(v) = d { acc.checked_mul(*v) } else { None })
    }
}

/// Where a value stopped being row-wise, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    /// The top-level node of the analysed graph (an If, Loop or function call holding
    /// the node at fault counts as the node).
    pub node: usize,
    /// The node at fault inside it, if it is inside: "node 'sm' (Softmax) in function 'Block'".
    pub inner: Option<String>,
    pub reason: String,
}

/// A value as the analysis sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    T(T),
    /// Its rows depend on other rows, or the analysis cannot tell that they do not.
    Mixed(Why),
    /// An optional input left out ("").
    Absent,
}

// --- constants ------------------------------------------------------------------------------

/// Tensors up to this many elements have their values read (shape arguments, axes).
const MAX_INTS: i64 = 4096;
const MAX_FLOATS: i64 = 64;

/// A constant tensor: its dims, and its values where small.
pub fn from_tensor(t: &TensorProto) -> T {
    let dims: Vec<Dim> = t.dims.iter().map(|&d| Dim::Fixed(d)).collect();
    let mut v = T::shaped(dims);
    let Some(n) = v.numel() else { return v };
    if crate::codec::tensor::is_external(t) || t.dims.len() > 1 {
        return v;
    }
    let raw = t.raw_data.as_deref().unwrap_or(&[]);
    let n = n as usize;
    match t.data_type.unwrap_or(0) {
        7 if (n as i64) <= MAX_INTS => {
            let vals: Vec<i64> = if !t.int64_data.is_empty() {
                t.int64_data.clone()
            } else {
                raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
            };
            if vals.len() == n {
                v.ints = Some(vals.into_iter().map(Elem::Known).collect());
            }
        }
        6 if (n as i64) <= MAX_INTS => {
            let vals: Vec<i64> = if !t.int32_data.is_empty() {
                t.int32_data.iter().map(|&x| i64::from(x)).collect()
            } else {
                raw.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes")))).collect()
            };
            if vals.len() == n {
                v.ints = Some(vals.into_iter().map(Elem::Known).collect());
            }
        }
        1 if (n as i64) <= MAX_FLOATS => {
            let vals: Vec<f64> = if !t.float_data.is_empty() {
                t.float_data.iter().map(|&x| f64::from(x)).collect()
            } else {
                raw.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes")))).collect()
            };
            if vals.len() == n {
                v.floats = Some(vals);
            }
        }
        11 if (n as i64) <= MAX_FLOATS => {
            let vals: Vec<f64> = if !t.double_data.is_empty() {
                t.double_data.clone()
            } else {
                raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
            };
            if vals.len() == n {
                v.floats = Some(vals);
            }
        }
        _ => {}
    }
    v
}

/// The value of a Constant node.
pub fn constant(node: &NodeProto) -> T {
    let Some(a) = node.attribute.first() else { return T::opaque(false) };
    match a.name.as_deref().unwrap_or("") {
        "value" => a.t.as_ref().map_or_else(|| T::opaque(false), from_tensor),
        "value_int" => T::ints(true, vec![Elem::Known(a.i.unwrap_or(0))]),
        "value_ints" => T::ints(false, a.ints.iter().map(|&v| Elem::Known(v)).collect()),
        "value_float" => T { floats: Some(vec![f64::from(a.f.unwrap_or(0.0))]), ..T::shaped(vec![]) },
        "value_floats" => T {
            floats: Some(a.floats.iter().map(|&f| f64::from(f)).collect()),
            ..T::shaped(vec![Dim::Fixed(a.floats.len() as i64)])
        },
        "value_string" => T::shaped(vec![]),
        "value_strings" => T::shaped(vec![Dim::Fixed(a.strings.len() as i64)]),
        "sparse_value" => T::shaped(
            a.sparse_tensor.as_ref().map(|s| s.dims.iter().map(|&d| Dim::Fixed(d)).collect()).unwrap_or_default(),
        ),
        _ => T::opaque(false),
    }
}

// --- attributes --------------------------------------------------------------------------------

pub fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name.as_deref() == Some(name))
}

pub fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    attr(node, name).and_then(|a| a.i)
}

pub fn ints_attr(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}

pub fn str_attr(node: &NodeProto, name: &str) -> Option<String> {
    attr(node, name).and_then(|a| a.s.as_ref()).map(|s| String::from_utf8_lossy(s).into_owned())
}

pub fn float_attr(node: &NodeProto, name: &str) -> Option<f32> {
    attr(node, name).and_then(|a| a.f)
}

/// `axis` of a value of `rank` dims, negative counting from the end.
pub fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let k = if a < 0 { a + r } else { a };
    if (0..r).contains(&k) {
        Ok(k as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// Several axes, normalised.
pub fn axes(list: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    list.iter().map(|&a| axis(a, rank)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_read_their_small_values() {
        let t = TensorProto { dims: vec![2], data_type: Some(7), int64_data: vec![-1, 400], ..Default::default() };
        assert_eq!(from_tensor(&t).known(), Some(vec![-1, 400]));
        let raw = TensorProto {
            dims: vec![2],
            data_type: Some(7),
            raw_data: Some(bytes::Bytes::from([0i64, 5].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())),
            ..Default::default()
        };
        assert_eq!(from_tensor(&raw).known(), Some(vec![0, 5]));
        let scalar = TensorProto { dims: vec![], data_type: Some(6), int32_data: vec![3], ..Default::default() };
        let v = from_tensor(&scalar);
        assert!(v.scalar() && v.known_one() == Some(3));
        let short = TensorProto { dims: vec![3], data_type: Some(7), int64_data: vec![1], ..Default::default() };
        assert_eq!(from_tensor(&short).known(), None, "a tensor whose data does not match its dims tells nothing");
        let matrix = TensorProto { dims: vec![2, 2], data_type: Some(7), int64_data: vec![1; 4], ..Default::default() };
        assert_eq!(from_tensor(&matrix).dims, Some(vec![Dim::Fixed(2), Dim::Fixed(2)]));
    }

    #[test]
    fn axes_count_from_the_end_and_refuse_out_of_range() {
        assert_eq!(axis(-1, 3), Ok(2));
        assert_eq!(axis(0, 3), Ok(0));
        assert!(axis(3, 3).is_err() && axis(-4, 3).is_err());
    }
}
