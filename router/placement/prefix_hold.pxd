cdef class PrefixHold:
    cdef dict __dict__
    cdef public object enabled
    cdef public object wait_s
    cdef public object min_tokens
    cdef public object spills
    cdef public object committed_prefix
    cdef public object routable
    cdef public object queued_cost_before
    cdef public object clock
