cdef class LoadOrder:
    cdef dict __dict__
    cdef public object key
    cdef public object uniform
    cdef public object built_after
    cdef public object single_slot
    cdef public object theta
    cdef public object mask
    cdef public object owner
    cdef public object bits
    cdef public object members
    cdef public object stale
    cdef public object _entries
    cdef public object _groups
