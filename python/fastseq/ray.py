"""Ray Data (extra ``fastseq-onnx[ray]``): ``fastseq.ray.Predictor``, ``ship``, ``map_batches``,
``error_of``. The public name of :mod:`fastseq.integrations.ray`, where the code lives."""

from fastseq.integrations.ray import Predictor, Shipment, error_of, map_batches, run_dataset, ship

__all__ = ["Predictor", "Shipment", "error_of", "map_batches", "run_dataset", "ship"]
