//! The `ai.onnx.ml` operators (scikit-learn's converters): most take a matrix of samples
//! [N, features] and answer per sample, so they keep rows apart when the batch axis is
//! axis 0 of a 2-D input. A 1-D input is one sample to them (its entries are features):
//! batching along it would mix.
use crate::merge::rows::args::{dims_of, each, one, unknown, Args, Outs, R};
use crate::merge::rows::value::{attr, Dim, T};

/// Operators that map each element on its own.
const ELEMENTWISE: &[&str] = &["Binarizer", "LabelEncoder", "CategoryMapper"];
/// Operators that answer per sample of a [N, features] matrix.
const PER_SAMPLE: &[&str] = &[
    "Scaler",
    "Imputer",
    "Normalizer",
    "LinearClassifier",
    "LinearRegressor",
    "SVMClassifier",
    "SVMRegressor",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "TreeEnsemble",
    "OneHotEncoder",
    "ZipMap",
    "FeatureVectorizer",
];

pub fn step(args: &Args, op: &str) -> R<Outs> {
    if ELEMENTWISE.contains(&op) {
        let x = args.need(0)?;
        return one(T { on_n: x.on_n, dims: x.dims.clone(), ..T::default() });
    }
    if op == "ArrayFeatureExtractor" {
        return array_feature_extractor(args);
    }
    if !PER_SAMPLE.contains(&op) {
        return unknown(args, &format!("{op} (domain 'ai.onnx.ml')"));
    }
    if !args.rows() {
        return unknown(args, op);
    }
    if args.ins.iter().flatten().any(|t| t.on_n) {
        return Err(format!("{op} is given values computed from the number of rows"));
    }
    for t in args.ins.iter().flatten() {
        if t.batch() != Some(0) || t.rank() != Some(2) {
            return Err(format!(
                "{op} takes a matrix of samples [N, features]: the batch axis must be axis 0 of a 2-D input \
                 (a 1-D input is one sample, whose entries would be the rows)"
            ));
        }
    }
    let x = args.need(0)?;
    let features = x.dims().expect("rows")[1];
    match op {
        "Scaler" | "Imputer" | "Normalizer" => one(T::shaped(vec![Dim::Batch, features])),
        "OneHotEncoder" => {
            let cats = attr(args.node, "cats_int64s")
                .map(|a| a.ints.len())
                .filter(|n| *n > 0)
                .or_else(|| attr(args.node, "cats_strings").map(|a| a.strings.len()));
            let depth = cats.map_or(Dim::Free(None), |n| Dim::Fixed(n as i64));
            one(T::shaped(vec![Dim::Batch, features, depth]))
        }
        "ZipMap" => one(T::shaped(vec![Dim::Batch])),
        "LinearClassifier" | "SVMClassifier" | "TreeEnsembleClassifier" => {
            let mut outs = vec![Ok(T::shaped(vec![Dim::Batch]))];
            for _ in 1..args.outputs() {
                outs.push(Ok(T::shaped(vec![Dim::Batch, Dim::Free(None)])));
            }
            Ok(outs)
        }
        _ => each(args, T::shaped(vec![Dim::Batch, Dim::Free(None)])),
    }
}

/// Y = X[..., indices]: the last axis of X picked by the indices (flattened). A constant
/// table looked up by each row's indices keeps the rows, as long as each row has one index.
fn array_feature_extractor(args: &Args) -> R<Outs> {
    let (x, idx) = (args.need(0)?, args.need(1)?);
    if !args.rows() {
        return unknown(args, "ArrayFeatureExtractor");
    }
    if x.on_n || idx.on_n {
        return Err("ArrayFeatureExtractor is given values computed from the number of rows".into());
    }
    let (Some(dx), Some(di)) = (dims_of(args, x)?, dims_of(args, idx)?) else {
        return Err("ArrayFeatureExtractor picks with values whose shape cannot be told".into());
    };
    let lead: Vec<Dim> = if dx.len() <= 1 { vec![Dim::Fixed(1)] } else { dx[..dx.len() - 1].to_vec() };
    match (x.batch(), idx.batch()) {
        (Some(b), None) if b + 1 < dx.len() => {
            let picked = idx.numel().map_or(Dim::Free(None), Dim::Fixed);
            one(T::shaped(lead.into_iter().chain([picked]).collect()))
        }
        (None, Some(c)) if di.iter().enumerate().all(|(k, d)| k == c || *d == Dim::Fixed(1)) => {
            one(T::shaped(lead.into_iter().chain([Dim::Batch]).collect()))
        }
        (None, Some(_)) => {
            Err("ArrayFeatureExtractor flattens indices of several entries per row into one axis".into())
        }
        _ => Err("ArrayFeatureExtractor picks along the batch axis".into()),
    }
}
