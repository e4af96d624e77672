# The master's job-creation harness, tests/fuzz/fuzz_create_job.cc (issue 15): included by
# tests/fuzz/CMakeLists.txt in the fuzz build (clang, PS_FUZZ); nothing else builds it.
#
# Defines the target fuzz_create_job (in <build>/fuzz) and appends it to PS_FUZZ_TARGETS,
# with its seed corpus in PS_FUZZ_CORPUS_fuzz_create_job, for scripts/fuzz.sh and the
# ctest entries tests/fuzz/CMakeLists.txt makes for every harness.
#
# The job-creation and dispatch sources are compiled into the harness itself with the
# fuzzer's instrumentation, so libFuzzer sees their coverage however ps_master was built;
# ps_master supplies the rest (the store's batches, protos). Their symbols then come from
# these objects, never from libps_master.a's members of the same names.
#
# Seeds (tests/fuzz/corpus/create_job/<name>, protoc --encode=ps.CreateJobRequest of):
#   small_eval   name: "j" epochs: 2 records_per_task: 4
#                files { path: "a" records: 10 } eval_files { path: "e" records: 5 }
#   wrap         name: "wrap" epochs: 1 records_per_task: 9223372036854775808
#                files { path: "a" records: 18446744073709551615 } files { path: "b" records: 1 }
#   huge_file    name: "h" epochs: 1 records_per_task: 9223372036854775808
#                files { path: "a" records: 18446744073709551615 }
#   many_epochs  name: "m" epochs: 4294967295 records_per_task: 1 files { path: "a" records: 1 }
#   limit        name: "l" epochs: 4 records_per_task: 3 files { path: "a" records: 3072 }
#   empty_files  name: "z" epochs: 3 records_per_task: 2 files { path: "a" records: 0 }
#                files { path: "b" records: 5 } eval_files { path: "e" records: 0 }
#   bad_name     name: "../x y" epochs: 1 records_per_task: 1 files { path: "a" records: 1 }
set(PS_FUZZ_MASTER_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
add_executable(fuzz_create_job
  ${CMAKE_CURRENT_LIST_DIR}/fuzz_create_job.cc
  ${CMAKE_SOURCE_DIR}/master/job.cc
  ${CMAKE_SOURCE_DIR}/master/job_dispatcher.cc
  ${CMAKE_SOURCE_DIR}/master/job_dispatcher_workers.cc
  ${CMAKE_SOURCE_DIR}/master/job_dispatcher_retention.cc
  ${CMAKE_SOURCE_DIR}/master/counters_record.cc)
target_compile_options(fuzz_create_job PRIVATE ${PS_FUZZ_MASTER_FLAGS})
target_link_options(fuzz_create_job PRIVATE ${PS_FUZZ_MASTER_FLAGS})
target_link_libraries(fuzz_create_job PRIVATE ps_master ps_embedding glog::glog)
set_target_properties(fuzz_create_job PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
list(APPEND PS_FUZZ_TARGETS fuzz_create_job)
set(PS_FUZZ_CORPUS_fuzz_create_job ${CMAKE_CURRENT_LIST_DIR}/corpus/create_job)
