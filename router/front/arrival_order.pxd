cdef class ArrivalOrder:
    cdef dict __dict__
    cdef public object _issued
    cdef public object _turn
    cdef public object _left
    cdef public object _waiting
