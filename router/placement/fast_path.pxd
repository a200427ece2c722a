cdef class FastPath:
    cdef dict __dict__
    cdef public object cfg
    cdef public object index
    cdef public object policy
