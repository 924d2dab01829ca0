"""Plain-numpy truncated variational EM for Gaussian mixtures with per-cluster variances (``"spherical"``:
σ²_c I), diagonal ones (``"diag"``: diag(σ²_c1 … σ²_cD)), full ones (``"full"``: Σ_c) or one shared
(``"tied"``: Σ) and mixing weights π_c, learned or equal.

vc-GMM's E-step (Hirschberger, Forster, Lücke, TPAMI 2022, Alg. 1-2: tests/reference/vcgmm.py) with the
score of cluster c for row x in place of −d²/2σ²:

    ℓ_c(x) = log π_c − ½ Σ_d [log(2π σ²_cd) + (x_d − μ_cd)² / σ²_cd]

S_n = ∪_{c ∈ K^(n)} G_c; K^(n) ← the C' clusters of S_n with the largest ℓ; s_nc = softmax of ℓ over K^(n);
G_c ← c and the G−1 partners with the smallest mean −ℓ over the rows c won. M-step with row weights w:
U_c = Σ w s, π_c = U_c / Σ w, μ_c = Σ w s x / U_c, σ²_cd = Σ w s (x_d − μ_cd)² / U_c + reg_covar
(spherical: the mean over d; full: Σ_c = Σ w s (x − μ_c)(x − μ_c)ᵀ / U_c + reg_covar I; tied: the sum of
those over c divided by Σ w); a cluster no row reaches (U_c = 0) keeps its parameters. A full or tied score is
taken from the log-determinant and a linear solve, not a Cholesky factor. The free energy
F = Σ w log Σ_{c ∈ K^(n)} exp ℓ_c(x_n) bounds the log-likelihood from below, and is the log-likelihood when
C' = C: one iteration is then exact EM, as scikit-learn's GaussianMixture runs it. Row by row, for small
data: the oracle of the mixture tests."""

import numpy as np

from tests.reference.vcgmm import estep_search, update_neighbourhoods


def scores(x, mu, var, log_pi, S):
    """ℓ_c(x) for the clusters S; ``var`` is (C, D) (a spherical model repeats σ²_c over d), (C, D, D) full
    covariances, or (D, D) one shared."""
    x = x.astype(np.float64)
    if var.ndim == 2 and var.shape != mu.shape:
        var = np.broadcast_to(var, (len(mu),) + var.shape)
    if var.ndim == 3:
        out = np.empty(len(S))
        for j, c in enumerate(S):
            v = x - mu[c]
            out[j] = log_pi[c] - 0.5 * (
                len(x) * np.log(2 * np.pi) + np.linalg.slogdet(var[c])[1] + v @ np.linalg.solve(var[c], v)
            )
        return out
    return log_pi[S] - 0.5 * (np.log(2 * np.pi * var[S]) + (x - mu[S]) ** 2 / var[S]).sum(1)


def posteriors(Kl):
    """s over K^(n) and log Σ_{c ∈ K^(n)} exp ℓ_c per row."""
    top = Kl.max(axis=1, keepdims=True)
    e = np.exp(Kl - top)
    z = e.sum(axis=1, keepdims=True)
    return e / z, (top + np.log(z))[:, 0]


def m_step(X, w, K, s, mu, var, pi, covariance_type="diag", weights="learned", reg_covar=1e-6):
    C, D = mu.shape
    X = X.astype(np.float64)
    ws = w[:, None] * s
    U = np.zeros(C)
    np.add.at(U, K, ws)
    sums = np.zeros((C, D))
    for a in range(K.shape[1]):
        np.add.at(sums, K[:, a], ws[:, a, None] * X)
    won = U > 0
    new_mu, new_var = mu.copy(), var.copy()
    new_mu[won] = sums[won] / U[won, None]
    if covariance_type in ("full", "tied"):
        sq = np.zeros((C, D, D))
        for a in range(K.shape[1]):
            v = X - new_mu[K[:, a]]
            np.add.at(sq, K[:, a], ws[:, a, None, None] * v[:, :, None] * v[:, None, :])
        if covariance_type == "tied":
            new_var = sq.sum(axis=0) / w.sum() + reg_covar * np.eye(D)
        else:
            new_var[won] = sq[won] / U[won, None, None] + reg_covar * np.eye(D)
        new_pi = U / w.sum() if weights == "learned" else np.full(C, 1.0 / C)
        return new_mu, new_var, new_pi
    sq = np.zeros((C, D))
    for a in range(K.shape[1]):
        np.add.at(sq, K[:, a], ws[:, a, None] * (X - new_mu[K[:, a]]) ** 2)
    new_var[won] = sq[won] / U[won, None] + reg_covar
    if covariance_type == "spherical":
        new_var[won] = new_var[won].mean(axis=1, keepdims=True)
    new_pi = U / w.sum() if weights == "learned" else np.full(C, 1.0 / C)
    return new_mu, new_var, new_pi


def em_step(X, w, mu, var, pi, K, Gc, **kw):
    """One iteration from (μ, σ², π, K^(n), G_c): the new parameters, K^(n), G_c and the free energy F at
    the parameters the E-step used."""
    log_pi = np.log(pi)

    def cost(x, mu, S):
        return -scores(x, mu, var, log_pi, S)

    K, Kcost, spaces = estep_search(X, mu, K, Gc, cost)
    Gc = update_neighbourhoods(Gc, K, spaces)
    s, lse = posteriors(-Kcost)
    return (*m_step(X, w, K, s, mu, var, pi, **kw), K, Gc, float((w * lse).sum()))


def gmm(X, w, mu, var, pi, K, Gc, tol=1e-4, max_iter=300, **kw):
    """EM until |ΔF| < tol |F|: (μ, σ², π, F per iteration)."""
    F = []
    for _ in range(max_iter):
        mu, var, pi, K, Gc, f = em_step(X, w, mu, var, pi, K, Gc, **kw)
        F.append(f)
        if len(F) > 1 and abs(F[-1] - F[-2]) < tol * abs(F[-1]):
            break
    return mu, var, pi, np.array(F)
