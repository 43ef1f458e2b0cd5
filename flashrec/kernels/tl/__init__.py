"""Triton kernels. Importing any module of this package imports ``triton``.

The public wrappers in ``flashrec.kernels`` import these modules lazily, so the rest of the
package works on machines without Triton.
"""
