# tests/gpu/custom_ar.mk: builds tests/gpu/check_custom_ar in a configured CUDA build
# directory with that directory's Makefile's variables (it is not part of Makefile.am):
#   make -f Makefile -f $SRC/tests/gpu/custom_ar.mk tests/gpu/check_custom_ar
# tests/gpu/custom_ar.sh does it and runs the check.
tests/gpu/check_custom_ar$(EXEEXT): $(top_srcdir)/tests/gpu/check_custom_ar.c src/libtp.a cuda/libtpcuda.a
	@$(MKDIR_P) tests/gpu
	$(CC) $(DEFS) $(DEFAULT_INCLUDES) -I$(top_srcdir)/src -I$(top_srcdir)/cuda $(CUDA_CPPFLAGS) \
		$(NCCL_CPPFLAGS) $(CPPFLAGS) $(AM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ \
		$(top_srcdir)/tests/gpu/check_custom_ar.c cuda/libtpcuda.a src/libtp.a cuda/libtpcuda.a $(BASE_LIBS) -lm
