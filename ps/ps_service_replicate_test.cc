// The follower's lane (PsServiceOptions::replicate_pool): a primary's ReplicateRecords
// batch runs on its own thread, never queued behind the pod's pushes and pulls in the
// request pool. At R=2 with ack=all each pod's pushes wait for the other pod's follower;
// when its batches shared the pool, they waited behind that pod's own pushes, which wait in
// turn for this pod's follower (docs/benchmarks.md, "Replicated shards").
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/work_pool.h"
#include "proto/ps.grpc.pb.h"
#include "ps/ps_core.h"
#include "ps/ps_service.h"

namespace ps {
namespace {

TEST(PsServiceReplicateTest, FollowerBatchIsAnsweredWhileEveryRequestWorkerIsBusy) {
  PsCore core(PsCoreOptions(), ShardOwnership::All(16));
  WorkPool pool(WorkPoolOptions{/*threads=*/1, /*max_queued=*/16});
  // The request pool's only thread is held (as by pushes waiting for their turn) until the
  // batch has its answer.
  absl::Notification held, release;
  ASSERT_TRUE(pool.TrySubmit([&] {
    held.Notify();
    release.WaitForNotification();
  }));
  absl::Cleanup let_go = [&] {
    if (!release.HasBeenNotified()) release.Notify();
  };
  held.WaitForNotification();

  PsService service(&core, &pool);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  ReplicateRecordsRequest req;
  req.set_primary("ps-9");
  req.set_epoch(1);
  ReplicateRecordsResponse resp;
  grpc::ClientContext ctx;
  // Far longer than the answer takes; queued behind the held worker it never comes.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const grpc::Status s = stub->ReplicateRecords(&ctx, req, &resp);
  // PsCore's own answer: this pod follows no vshard of ps-9.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("ps-9"), std::string::npos) << s.error_message();
  EXPECT_TRUE(pool.queued() == 0);

  release.Notify();
  server->Shutdown();
}

}  // namespace
}  // namespace ps
