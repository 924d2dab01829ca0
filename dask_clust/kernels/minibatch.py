"""Sculley's running means (WWW 2010, Alg. 1 over a whole batch, as scikit-learn's ``MiniBatchKMeans``): each
centre given rows becomes the mean of every row it was ever given, in one pass over the centres (k × D: at
D = 50,000 documents' columns, numpy's temporaries made this pass the batch's largest cost)."""

from numba import njit


@njit(nogil=True, cache=True)
def running_means(centers, sums, weights, total, out):
    """out[j] = c_j + (Σ w x − (Σ w) c_j) / v_j for centres given rows (weights > 0), else c_j.

    centers : IN float64 (k, d);  sums : IN float64 (k, d) the batch's Σ w x per centre
    weights : IN float64 (k,) the batch's Σ w per centre;  total : IN float64 (k,) v_j, this batch's included
    out     : OUT float64 (k, d)
    """
    for j in range(centers.shape[0]):
        wj, vj = weights[j], total[j]
        if wj > 0:
            for t in range(centers.shape[1]):
                c = centers[j, t]
                out[j, t] = c + (sums[j, t] - wj * c) / vj
        else:
            out[j] = centers[j]
