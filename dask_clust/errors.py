"""The errors a user catches, in one place (each is also ``dask_clust.<name>``): every one is raised before
work is spent on input or settings that cannot succeed, with a message naming what is wrong."""


class InputError(ValueError):
    """Bad input found before any work was spent (ARCHITECTURE.md, rule 8)."""


class InvalidParameterError(ValueError, TypeError):
    """A parameter outside its declared set; the message names the parameter, the set and the value."""


class InvalidModelError(ValueError):
    """A saved model that cannot be read: the message names the path and the first problem found."""


class SchedulerUnreachable(OSError):
    """No scheduler answered at the address given."""


class TLSRefused(SchedulerUnreachable):
    """A scheduler that speaks TLS and this client could not agree: this client lacks the settings TLS needs,
    or one side's certificate is not signed by the CA the other trusts, or the client spoke plain TCP."""


class ClusterLost(RuntimeError):
    """The fit lost what it cannot rebuild: the scheduler, or every worker that could hold its partitions."""


class NoWorkers(ClusterLost):
    """The cluster had no worker within ``first-worker-timeout`` of the fit's start (none ever came)."""


class UnguardedScript(RuntimeError):
    """A script without an ``if __name__ == "__main__":`` guard started a LocalCluster."""


class ConvergenceWarning(UserWarning):
    """A fit ended at its iteration limit before its stopping rule held (scikit-learn's warning of the same
    name, without importing scikit-learn)."""


def install_hint(extra):
    """How to install an optional extra: dask_clust is installed from its repository (it is not on the package
    index), so the extra is named on the checkout."""
    return f"pip install '.[{extra}]' in the dask_clust checkout (or '/path/to/dask_clust[{extra}]')"
