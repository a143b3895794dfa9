//! What an operator's rule is given (its node, its inputs as the analysis sees them, the
//! opset) and the small helpers every rule uses.
use crate::codec::proto::NodeProto;
use crate::merge::rows::value::{Dim, T};

pub type R<X> = Result<X, String>;
/// Per output: what it is, or why its rows are not independent.
pub type Outs = Vec<R<T>>;

/// The operator's inputs as the analysis sees them (None: an optional input left out).
pub struct Args<'a> {
    pub node: &'a NodeProto,
    pub ins: &'a [Option<T>],
    /// The default domain's opset version the node is read with.
    pub opset: i64,
}

impl<'a> Args<'a> {
    pub fn get(&self, k: usize) -> Option<&'a T> {
        self.ins.get(k).and_then(Option::as_ref)
    }

    pub fn need(&self, k: usize) -> R<&'a T> {
        self.get(k).ok_or_else(|| format!("{} has no input {k}", self.op()))
    }

    pub fn op(&self) -> &'a str {
        self.node.op_type.as_deref().unwrap_or("")
    }

    pub fn outputs(&self) -> usize {
        self.node.output.len()
    }

    /// Any input with a batch axis.
    pub fn rows(&self) -> bool {
        self.ins.iter().flatten().any(|t| t.batch().is_some())
    }

    /// Every input the same whatever the batch.
    pub fn all_fixed(&self) -> bool {
        self.ins.iter().flatten().all(T::fixed)
    }

    /// Refuses input `k` if it depends on the batch: for inputs that are weights, shapes,
    /// axes or settings, not data.
    pub fn setting(&self, k: usize, what: &str) -> R<()> {
        match self.get(k) {
            Some(t) if t.batch().is_some() => Err(format!("{} reads its {what} from the rows", self.op())),
            Some(t) if t.on_n => Err(format!("{} computes its {what} from the number of rows", self.op())),
            _ => Ok(()),
        }
    }
}

pub fn one(t: T) -> R<Outs> {
    Ok(vec![Ok(t)])
}

/// The same value on every output.
pub fn each(args: &Args, t: T) -> R<Outs> {
    Ok(vec![Ok(t); args.outputs().max(1)])
}

/// An operator the table does not know: harmless on values that do not depend on the batch
/// (their outputs neither), refused on any other.
pub fn unknown(args: &Args, what: &str) -> R<Outs> {
    if args.all_fixed() {
        return each(args, T::opaque(false));
    }
    Err(format!("{what} is not known to keep the rows of a batch apart"))
}

/// The dims of `t`, which must be known where it has a batch axis.
pub fn dims_of<'t>(args: &Args, t: &'t T) -> R<Option<&'t [Dim]>> {
    match t.dims() {
        Some(d) => Ok(Some(d)),
        None if t.on_n => Err(format!("{} cannot tell the shape of a value computed from the batch size", args.op())),
        None => Ok(None),
    }
}
